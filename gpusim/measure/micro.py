"""The micro suite: the only data calibration may fit.

GEMM sweeps (square and skinny, per precision), convolutions of common CNNs, fused attention,
elementwise and reduction kernels from 4 KB up, copies on the device and across PCIe (pinned
and pageable), the device-side cost of an empty kernel and the host's cost per dispatched op.
Cases the device cannot run in reasonable time (a CPU with a 16k GEMM) are left out by a
FLOP or byte cap, which the file records. Cases at the level of PyTorch's layers (SDPA per
backend, norms, batch norm, the optimizer, each layer's host cost) are in micro_layers.
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from gpusim.measure.timing import Timing, time_call, time_graph
from gpusim.workload import zoo
from gpusim.workload.layers import Conv2d

TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
                "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Limits:
    """What the device is asked to run: precisions and the largest case of each kind."""

    precisions: tuple[str, ...]
    max_gemm_flops: float
    max_bytes: float  # one elementwise operand
    conv_batch: int
    attention_batch: int
    fp8: bool = False

    @staticmethod
    def for_device(device: torch.device) -> Limits:
        if device.type == "cuda":
            major, _ = torch.cuda.get_device_capability(device)
            return Limits(("fp32", "tf32", "fp16", "bf16"), 1e13, 4 * 2**30, 32, 8,
                          fp8=major >= 9)
        return Limits(("fp32", "bf16"), 2e10, 256 * 2**20, 2, 1)


def gemm_shapes() -> list[tuple[int, int, int]]:
    """(m, n, k): square 64..16384, skinny (few rows or a short K), thin (a side below the
    smallest 64-wide tile, which calibrate fits apart: gemm.thin_efficiency), and
    transformer shapes."""
    square = [(s, s, s) for s in (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)]
    skinny = [(8192, 64, 1024), (64, 8192, 1024), (1024, 1024, 64), (16384, 1024, 64),
              (8192, 8192, 64), (64, 64, 16384), (128, 4096, 4096), (4096, 128, 4096),
              (2048, 16384, 256)]
    # 16 and 32 tokens; a LoRA rank of 16 (its A product and weight gradient); a router
    # over 8 experts
    thin = [(16, 8192, 4096), (32, 8192, 4096), (8192, 16, 4096), (16, 4096, 8192),
            (8192, 8, 4096)]
    # tokens x (3h | h | 4h) x h, and the weight-gradient shape (h x h x tokens)
    transformer = [(4096, 2304, 768), (4096, 768, 3072), (4096, 3072, 768), (768, 768, 4096),
                   (8192, 12288, 4096), (8192, 4096, 14336), (4096, 4096, 8192)]
    return square + skinny + transformer + thin


def misaligned_gemm_shapes() -> list[tuple[int, int, int]]:
    """Dimensions that are not multiples of 8 or 16: cuBLAS falls back to slower tiles or
    pads, so these are kept apart from the aligned sweep (``misaligned`` in the file)."""
    return [(1000, 1000, 1000), (4095, 4096, 4096), (4096, 4096, 4095), (4097, 4097, 4097),
            (8191, 8192, 1023), (50257, 768, 4096), (4096, 50257, 768)]


def conv_shapes(batch: int) -> list[dict[str, int]]:
    """Distinct convolutions of ResNet-50, VGG16 and the MNIST CNN at ``batch``."""
    seen: dict[tuple[int, ...], dict[str, int]] = {}
    for name in ("resnet50", "vgg16", "mnist-cnn"):
        for layer in zoo.get(name).layers:
            if isinstance(layer, Conv2d):
                key = (layer.in_channels, layer.out_channels, layer.kernel, layer.height,
                       layer.width, layer.stride, layer.padding)
                seen.setdefault(key, {"batch": batch, "in_channels": key[0],
                                      "out_channels": key[1], "kernel": key[2],
                                      "height": key[3], "width": key[4], "stride": key[5],
                                      "padding": key[6], "bias": int(layer.bias)})
    return list(seen.values())


def attention_shapes(batch: int) -> list[dict[str, Any]]:
    """(batch, heads, seq, head_dim, causal) as BERT, GPT-2 and Llama use them."""
    return [{"batch": batch, "heads": h, "seq": s, "head_dim": d, "causal": c}
            for h, s, d, c in [(12, 128, 64, False), (12, 512, 64, False), (12, 1024, 64, True),
                               (16, 1024, 64, True), (32, 2048, 128, True)]]


def elementwise_sizes(max_bytes: float) -> list[int]:
    """Operand sizes 4 KB, 16 KB, ... up to 4 GB (or the device's cap)."""
    return [4096 * 4**i for i in range(12) if 4096 * 4**i <= max_bytes]


def rotated(make: Callable[[], Any], size_bytes: float, cache_bytes: float) -> list[Any]:
    """Enough input sets that cycling through them spills the last-level cache."""
    sets = min(16, max(2, math.ceil(2 * cache_bytes / max(size_bytes, 1))))
    return [make() for _ in range(sets)]


def _cycle(fns: list[Callable[[], Any]]) -> Callable[[], Any]:
    state = {"i": 0}

    def call() -> Any:
        state["i"] = (state["i"] + 1) % len(fns)
        return fns[state["i"]]()

    return call


def time_gemm(m: int, n: int, k: int, precision: str, device: torch.device,
              repeats: int, graph: bool = False) -> Timing:
    """``torch.mm`` into a preallocated output, in a loop (the host issues every call) or,
    with ``graph``, replayed from a CUDA graph (device time alone)."""
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    dtype = TORCH_DTYPES[precision]
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    c = torch.empty(m, n, device=device, dtype=dtype)
    if graph:
        return time_graph(lambda: torch.mm(a, b, out=c), device, repeats=repeats)
    return time_call(lambda: torch.mm(a, b, out=c), device, repeats=repeats)


def time_sustained_gemm(m: int, n: int, k: int, precision: str, device: torch.device,
                        seconds: float, window_s: float = 0.5) -> SustainedTiming:
    """``torch.mm`` back to back for ``seconds``, timed in windows of ``window_s``, with the
    SM clock, power and temperature sampled beside it: how far a GPU under sustained
    tensor-core load falls below the short bursts the other cases time (its power limit
    and heat bring the clock down). Reads the clocks; never sets them."""
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    dtype = TORCH_DTYPES[precision]
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    c = torch.empty(m, n, device=device, dtype=dtype)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    clocks = ClockSampler()
    windows = []
    began = time.perf_counter()
    clocks.start()
    try:
        while time.perf_counter() - began < seconds:
            sync()
            start, calls = time.perf_counter(), 0
            while time.perf_counter() - start < window_s:
                for _ in range(8):
                    torch.mm(a, b, out=c)
                calls += 8
                sync()
            elapsed = time.perf_counter() - start
            windows.append({"t_s": round(start - began, 3), "calls": calls,
                            "per_call_s": elapsed / calls})
    finally:
        samples = clocks.stop()
    steady = sorted(w["per_call_s"] for w in windows[len(windows) // 2:])
    return SustainedTiming(steady[len(steady) // 2], steady[len(steady) // 10],
                           steady[(9 * len(steady)) // 10], len(steady), 1,
                           windows[0]["per_call_s"], windows, samples)


@dataclass(frozen=True)
class SustainedTiming(Timing):
    """A sustained run's steady state (the median window of its second half, per call), its
    first window, and every window and clock sample."""

    first_window_s: float
    windows: list[dict[str, float]]
    clocks: list[dict[str, float]]


class ClockSampler:
    """nvidia-smi's SM clock, power draw and temperature every 200 ms, in the background
    (an empty list where nvidia-smi is missing)."""

    FIELDS = "clocks.sm,power.draw,temperature.gpu"

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        try:
            self._proc = subprocess.Popen(
                ["nvidia-smi", f"--query-gpu={self.FIELDS}", "--format=csv,noheader,nounits",
                 "-lms", "200"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self._proc = None

    def stop(self) -> list[dict[str, float]]:
        if self._proc is None:
            return []
        self._proc.terminate()
        try:
            out, _ = self._proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            out, _ = self._proc.communicate()
        samples = []
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            try:
                sm, power, temp = (float(p) for p in parts[:3])
            except ValueError:
                continue
            samples.append({"sm_mhz": sm, "power_w": power, "temperature_c": temp})
        return samples


def time_gemm_fp8(m: int, n: int, k: int, device: torch.device, repeats: int) -> Timing:
    """e4m3 operands with bf16 output through ``torch._scaled_mm`` (Hopper and later)."""
    a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major
    one = torch.ones((), device=device)
    return time_call(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one,
                                              out_dtype=torch.bfloat16), device,
                     repeats=repeats)


def time_forward_backward(forward: Callable[[], Any], leaves: list[torch.Tensor],
                          device: torch.device, repeats: int) -> dict[str, Timing]:
    """Time ``forward()`` alone, and the backward of its output as one ``backward()`` call
    per sample (untimed: the gradients of ``leaves`` cleared, the forward run again, a
    random output gradient drawn; a scalar output, a loss, takes none)."""
    state: dict[str, Any] = {}

    def setup() -> None:
        for t in leaves:
            t.grad = None
        state["out"] = forward()
        state["grad"] = None if state["out"].dim() == 0 else torch.randn_like(state["out"])

    out = {"forward": time_call(forward, device, repeats=repeats),
           "backward": time_call(lambda: state["out"].backward(state["grad"]), device,
                                 setup=setup, repeats=repeats)}
    state.clear()  # free the graph before the next case allocates
    return out


def time_conv(shape: dict[str, int], precision: str, device: torch.device,
              repeats: int, channels_last: bool = False) -> dict[str, Timing]:
    """Forward, and backward producing both the input and the weight gradient; with
    ``channels_last``, module and input held NHWC (memory_format=torch.channels_last)."""
    conv = torch.nn.Conv2d(shape["in_channels"], shape["out_channels"], shape["kernel"],
                           shape["stride"], shape["padding"], bias=bool(shape["bias"]))
    layout = torch.channels_last if channels_last else torch.contiguous_format
    conv = conv.to(device).to(memory_format=layout)  # type: ignore[call-overload]
    x = torch.randn(shape["batch"], shape["in_channels"], shape["height"], shape["width"],
                    device=device).contiguous(memory_format=layout).requires_grad_()
    ctx = (torch.autocast(device.type, dtype=TORCH_DTYPES[precision])
           if precision in ("fp16", "bf16") else None)

    def forward() -> Any:
        if ctx is None:
            return conv(x)
        with torch.autocast(device.type, dtype=TORCH_DTYPES[precision]):
            return conv(x)

    return time_forward_backward(forward, [conv.weight, x], device, repeats)


def time_attention(shape: dict[str, Any], precision: str, device: torch.device,
                   repeats: int) -> dict[str, Timing]:
    dtype = TORCH_DTYPES[precision]
    dims = (shape["batch"], shape["heads"], shape["seq"], shape["head_dim"])
    q, k, v = (torch.randn(dims, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))

    def forward() -> Any:
        return F.scaled_dot_product_attention(q, k, v, is_causal=shape["causal"])

    return time_forward_backward(forward, [q, k, v], device, repeats)


def time_elementwise(op: str, size_bytes: int, device: torch.device, repeats: int,
                     cache_bytes: float, graph: bool = False,
                     dtype: torch.dtype = torch.float32) -> Timing:
    """``copy``, ``add`` (two inputs), ``sum`` (a reduction) into preallocated outputs,
    ``add_alloc``: an add whose output is allocated on each call, as eager PyTorch does, and
    ``cast``: fp32 into a preallocated bf16 tensor (autocast's weight casts). Operands of
    ``size_bytes`` each, in ``dtype``."""
    n = size_bytes // torch.empty(0, dtype=dtype).element_size()

    def operands() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (torch.randn(n, device=device, dtype=dtype),
                torch.randn(n, device=device, dtype=dtype),
                torch.empty(n, device=device, dtype=dtype))

    sets = rotated(operands, 3 * size_bytes, cache_bytes)
    calls: list[Callable[[], Any]] = []
    for a, b, out in sets:
        if op == "copy":
            calls.append(lambda a=a, out=out: out.copy_(a))
        elif op == "cast":
            low = torch.empty(n, device=device, dtype=torch.bfloat16)
            calls.append(lambda a=a, low=low: low.copy_(a))
        elif op == "add":
            calls.append(lambda a=a, b=b, out=out: torch.add(a, b, out=out))
        elif op == "sum":
            calls.append(lambda a=a: a.sum())
        else:
            calls.append(lambda a=a, b=b: a + b)
    if graph:
        return time_graph(_cycle(calls), device, calls=2 * len(calls), repeats=repeats)
    return time_call(_cycle(calls), device, repeats=repeats)


def time_dispatch(device: torch.device, repeats: int) -> Timing:
    """Host time per op for a one-element add: framework dispatch (and launch on a GPU).

    On a GPU the region is timed on the host without synchronizing inside it, so it is the
    rate at which the host issues ops; the queue never drains for one-element kernels.
    """
    a = torch.ones(1, device=device)
    b = torch.ones(1, device=device)
    out = torch.empty(1, device=device)
    ops = 200
    timing = time_call(lambda: [torch.add(a, b, out=out) for _ in range(ops)],
                       torch.device("cpu"), repeats=repeats, loop=False)
    return Timing(timing.median_s / ops, timing.p10_s / ops, timing.p90_s / ops,
                  timing.repeats, ops)


class _Add(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


def time_autograd_dispatch(device: torch.device, repeats: int) -> dict[str, Timing]:
    """Host time per op in training: a one-element op on tensors that require grad (the
    forward records an autograd node), per node of a backward pass through a chain, per
    call of a one-op ``nn.Module`` (the Python cost of a layer), and per ``backward()``
    call on a one-node graph (the cost of entering the autograd engine)."""
    ops = 200
    a = torch.ones(1, device=device, requires_grad=True)
    b = torch.ones(1, device=device)

    def chain() -> torch.Tensor:
        x = a
        for _ in range(ops):
            x = x + b
        return x

    forward = time_call(chain, torch.device("cpu"), repeats=repeats, loop=False)
    state: dict[str, torch.Tensor] = {}

    def setup() -> None:
        a.grad = None
        state["out"] = chain()

    backward = time_call(lambda: state["out"].backward(), device, setup=setup,
                         repeats=repeats)
    module = _Add()
    modules = time_call(lambda: [module(a, b) for _ in range(ops)], torch.device("cpu"),
                        repeats=repeats, loop=False)

    def one_node() -> None:
        a.grad = None
        state["out"] = a + b

    call = time_call(lambda: state["out"].backward(), device, setup=one_node, repeats=repeats)
    out = {name: Timing(t.median_s / ops, t.p10_s / ops, t.p90_s / ops, t.repeats, ops)
           for name, t in (("forward", forward), ("backward", backward), ("module", modules))}
    out["backward_call"] = call
    return out


def time_launch(device: torch.device, repeats: int) -> Timing:
    """Device time per empty-ish kernel: a CUDA graph of one-element adds, replayed."""
    a = torch.ones(1, device=device)
    kernels = 100
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            a.add_(1)  # warm up on a side stream, as graph capture requires
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        for _ in range(kernels):
            a.add_(1)
    timing = time_call(graph.replay, device, repeats=repeats, loop=False)
    return Timing(timing.median_s / kernels, timing.p10_s / kernels, timing.p90_s / kernels,
                  timing.repeats, kernels)


def time_host_copy(size_bytes: int, direction: str, pinned: bool, device: torch.device,
                   repeats: int) -> Timing:
    host = torch.empty(size_bytes, dtype=torch.uint8, pin_memory=pinned)
    dev = torch.empty(size_bytes, dtype=torch.uint8, device=device)
    if direction == "h2d":
        return time_call(lambda: dev.copy_(host, non_blocking=pinned), device, repeats=repeats)
    return time_call(lambda: host.copy_(dev, non_blocking=pinned), device, repeats=repeats)
