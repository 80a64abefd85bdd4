"""Which micro cases fit which calibration parameters: the fit's groups, in fitting order
(``fit_groups``), and the tests that decide whether a group's cases can tell a parameter
at all (a ramp needs short kernels, a host cost host-timed ones, a long-K slope cases on
both sides of the knee).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpusim.calibrate.micro_ops import (
    ROW_KERNEL_LAYERS,
    SDPA_KERNELS,
    kernel_timed,
    numerics,
    row_family,
)
from gpusim.cost.kernels import FP32_ATTENTION
from gpusim.hardware.calibration import GemmCalibration
from gpusim.hardware.profile import DeviceProfile
from gpusim.workload.attention import UNFUSED_ATTENTION
from gpusim.workload.layers import batch_norm
from gpusim.workload.ops import DTYPE_BYTES, TENSOR_CORE_MATH, GemmShape, result_bytes

Path_ = tuple[str, ...]  # a parameter's place in the calibration, e.g. ("gemm", "ramp_us")
BOTH_PASSES = "forward+backward"

# Smallest elementwise case timed in a loop that the memory fit takes when graph replays
# cover the small sizes (a 16 MiB copy takes ~10 us on the device, past the host's pace).
LOOP_MIN_BYTES = 2**24

# Smallest matrix product timed in a loop that the device fit takes when graph replays
# cover the small ones: 2^35 FLOPs run about 45 us at an H100's bf16 rate, and a 2^27-byte
# result (a short K over a large M x N) takes about as long to write; both are past the
# 10-40 us a host takes to issue one product from Python.
LOOP_MIN_FLOPS = 2**35
LOOP_MIN_WRITE_BYTES = 2**27

# The result's write (the epilogue, GemmCalibration.epilogue_exposed) is fitted where this
# many products spend at least EPILOGUE_MIN_SHARE of their datasheet compute time writing it
# at peak bandwidth: fewer, and it cannot be told apart from max_efficiency.
EPILOGUE_MIN_CASES = 3
EPILOGUE_MIN_SHARE = 0.5

# A slope of a product's rate against its inner dimension K is fitted only where a precision
# has this many tensor-core cases on each side of the calibration's knee, compute-bound
# sized (run longer than a ramp): fewer, and the slope would fit noise between two shapes.
LONG_K_MIN_CASES = 3

# An attention kernel's fixed work per query block is fitted where its cases cover this many
# sequence lengths (with fewer, it cannot be told apart from the kernel's rate).
SEQ_LENGTHS_FOR_OVERHEAD = 3

# The smallest GEMM tile side any calibration states (64 x 64).
SMALLEST_TILE = 64

# A ramp (the time a kernel loses to filling the device) shows only on short kernels: a group
# whose cases all run longer than this (published figures of large kernels) keeps the
# default ramp rather than fitting noise into it.
SHORT_KERNEL_S = 1e-4


Group = tuple[str, list[dict[str, Any]], list[tuple[Path_, str]]]


def spans_the_knee(cases: list[dict[str, Any]]) -> bool:
    """Whether tensor-core GEMM cases long enough to run at the power limit lie on both
    sides of the inner-dimension knee, enough of them to fit how the rate falls past it
    (see GemmCalibration.long_k_slope)."""
    knee: int = GemmCalibration.model_fields["long_k_knee"].default
    long: list[int] = [c["k"] for c in cases
                       if c["precision"] in TENSOR_CORE_MATH and c["median_s"] >= SHORT_KERNEL_S]
    return (sum(k > knee for k in long) >= LONG_K_MIN_CASES
            and sum(k <= knee for k in long) >= LONG_K_MIN_CASES)


def overhead_param(kernel: str, cases: list[dict[str, Any]]) -> list[tuple[Path_, str]]:
    """An attention kernel's fixed work per block of queries (GemmCalibration.
    attention_tile_overhead), where its cases span sequence lengths that tell it apart from
    the kernel's rate, and its softmax's share (attention_softmax_width), where they span
    head dimensions."""
    spans = len({c["seq"] for c in cases if "seq" in c}) >= SEQ_LENGTHS_FOR_OVERHEAD
    widths = len({c["head_dim"] for c in cases if "head_dim" in c}) >= 2
    params: list[tuple[Path_, str]] = []
    if spans:
        params.append((("gemm", "attention_tile_overhead", kernel), "blocks"))
    if widths:
        params.append((("gemm", "attention_softmax_width", kernel), "dims"))
    return params


# A call of a torch.compile'd function costs the host 100-200 us (its guards and Inductor's
# wrapper): the H100 micro suite's compiled RMS norm and silu*mul took 0.12-0.21 ms from
# 16 x 1024 up to 16384 x 4096 bf16 elements alike. Only inputs of 256 MiB and more keep the
# device busier than that, so only they tell the kernels' bandwidth.
COMPILED_MIN_BYTES = 2**28


def compiled_device_paced(case: dict[str, Any]) -> bool:
    """Whether a compiled row kernel's bf16 input is large enough to outlast the host's
    cost of calling it (COMPILED_MIN_BYTES)."""
    return int(case["rows"]) * int(case["cols"]) * 2 >= COMPILED_MIN_BYTES


def device_paced(case: dict[str, Any]) -> bool:
    """Whether a GEMM case timed in a loop ran longer on the device than the host takes to
    issue it: enough math, or a large enough result to write."""
    m, n, k = int(case["m"]), int(case["n"]), int(case["k"])
    return (2 * m * n * k >= LOOP_MIN_FLOPS
            or result_bytes(case["precision"]) * m * n >= LOOP_MIN_WRITE_BYTES)


def writes_matter(cases: list[dict[str, Any]], device: DeviceProfile) -> bool:
    """Whether enough products spend a large share of their time writing their result (a
    short K over a large M x N), at the datasheet's peak FLOP/s and bandwidth, to fit how
    much of that write the main loop hides."""
    def share(c: dict[str, Any]) -> float:
        """The write's time over the math's: M x N elements against 2 x M x N x K FLOPs."""
        peak, _ = device.peak_flops(c["precision"], matrix=True)
        return result_bytes(c["precision"]) * peak / (device.memory_bandwidth * 2.0 * int(c["k"]))
    return sum(share(c) >= EPILOGUE_MIN_SHARE for c in cases) >= EPILOGUE_MIN_CASES


def has_short(cases: list[dict[str, Any]]) -> bool:
    return any(c["median_s"] < SHORT_KERNEL_S for c in cases)


def has_host(cases: list[dict[str, Any]]) -> bool:
    """Whether any case's time includes the host's (timed in a loop, not on the device)."""
    return any(not kernel_timed(c) for c in cases)


def fit_groups(cases: list[dict[str, Any]], device: DeviceProfile) -> list[Group]:
    """(group name, its cases, its parameters) in fitting order."""
    def of(pred: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        return [c for c in cases if "median_s" in c and c.get("fit", True) and pred(c)]

    def sdpa(backend: str) -> list[dict[str, Any]]:
        """SDPA restricted to one backend: that kernel's own efficiency (16-bit inputs:
        fp32 SDPA runs other products, fitted apart below)."""
        return of(lambda c: c["kind"] == "sdpa" and c.get("backend") == backend
                  and c.get("precision") != "fp32")

    def kernel_params(kernel: str, cases: list[dict[str, Any]]) -> list[tuple[Path_, str]]:
        """A kernel's forward and backward factors; one factor for both where every case
        times the two passes together (published forward+backward figures)."""
        apart = any(c["pass"] != "forward_backward" for c in cases)
        return [(("gemm", "attention_kernels", kernel, phase), "factor")
                for phase in (("forward", "backward") if apart else (BOTH_PASSES,))
                ] + overhead_param(kernel, cases)

    per_kernel: list[Group] = [
        (f"attention {kernel}", sdpa(backend), kernel_params(kernel, sdpa(backend)))
        for backend, kernel in SDPA_KERNELS.items()]
    # SDPA on fp32 inputs: its memory-efficient kernel, whichever backend was asked for
    # that takes them (cost.kernels.FP32_ATTENTION)
    fp32_attention = of(lambda c: c["kind"] == "sdpa" and c.get("precision") == "fp32"
                        and c.get("backend") in ("efficient", "auto"))

    # Small copies timed in a loop measure how fast the host issues them; where CUDA-graph
    # replays give their device time, those stand for the small sizes instead.
    graphed = any(kernel_timed(c) for c in cases if c["kind"] == "elementwise")
    def tiled(c: dict[str, Any]) -> bool:
        """A product the tile model describes: at least a smallest tile's rows and columns
        (thinner ones run GEMV-like or split-K kernels it does not; they are reported by
        benchmarks/published_micro.py, not fitted)."""
        return bool(min(c["m"], c["n"]) >= SMALLEST_TILE)

    def narrow(c: dict[str, Any]) -> bool:
        """A tensor-core GEMM whose rows the model finds misaligned (from its shape)."""
        return c["precision"] in TENSOR_CORE_MATH and not GemmShape(
            c["m"], c["n"], c["k"]).aligned(DTYPE_BYTES[c["precision"]])

    gemm = of(lambda c: c["kind"] == "gemm" and not narrow(c) and tiled(c))
    # max_efficiency is the row-major (nn) products'; the other layouts' factors are relative
    # to it, unless nn was never timed (published tables of nt products): then their figures
    # stand for it and the layout factors keep their defaults.
    row_major = [c for c in gemm if c.get("layout", "nn") == "nn"]
    layouts = [c for c in gemm if c.get("layout", "nn") != "nn"] if row_major else []
    gemm = row_major or gemm
    precisions = sorted({c["precision"] for c in gemm})
    misaligned = of(lambda c: c["kind"] == "gemm" and narrow(c) and tiled(c))
    # Small products timed in a loop measure how fast the host issues them (and that pace
    # moves between runs of one machine by 2x); where CUDA-graph replays give small
    # products' device time, those fit the device's figures and the loop-timed ones fit
    # only the host's.
    gemm_graphed = any(kernel_timed(c) for c in gemm)
    gemm_host = [c for c in gemm if gemm_graphed and not kernel_timed(c)
                 and not device_paced(c)] if device.is_gpu else []
    gemm = [c for c in gemm if c not in gemm_host]
    # Thin products (a side below the smallest tile) fit their own tile efficiency, with the
    # full-tile figures above fixed; loop-timed ones where graph replays exist pace the host.
    thin = [c for c in of(lambda c: c["kind"] == "gemm" and not tiled(c))
            if kernel_timed(c) or not gemm_graphed or device_paced(c)]
    gemm_params: list[tuple[Path_, str]] = [
        (("gemm", "max_efficiency", p), "efficiency") for p in precisions]
    gemm_params += [(("gemm", "long_k_slope", p), "slope") for p in precisions
                    if spans_the_knee([c for c in gemm if c["precision"] == p])]
    if has_short(gemm):
        gemm_params.append((("gemm", "ramp_us"), "us"))
    if device.is_gpu and writes_matter(gemm, device):
        gemm_params.append((("gemm", "epilogue_exposed"), "share"))
    host_params: list[tuple[Path_, str]] = []
    host_cases = gemm_host or gemm
    if device.is_gpu and has_host(host_cases):
        # a cuBLAS call's host cost, and an fp8 product's beyond it
        host_params.append((("overhead", "cublas_us"), "us"))
        if has_host([c for c in host_cases if c["precision"] == "fp8"]):
            host_params.append((("overhead", "scaled_mm_us"), "us"))
    if not gemm_host:
        gemm_params += host_params
    # (casts change type in an unvectorized kernel of their own: not a copy's bandwidth)
    memory = of(lambda c: c["kind"] == "elementwise" and c["op"] not in ("add_alloc", "cast")
                and (kernel_timed(c) or not graphed or c["bytes"] >= LOOP_MIN_BYTES))
    memory_params: list[tuple[Path_, str]] = [(("memory", "max_efficiency"), "efficiency")]
    if not device.is_gpu:
        memory_params.append((("memory", "cache_efficiency"), "efficiency"))
    if has_short(memory):
        memory_params.append((("memory", "ramp_us"), "us"))
    rows = of(lambda c: c["kind"] == "row_kernel" and c["op"] in ROW_KERNEL_LAYERS
              and (not c.get("compiled") or compiled_device_paced(c)))
    row_families = sorted({row_family(c, device) for c in rows})
    conv = of(lambda c: c["kind"] == "conv")
    auto = of(lambda c: c["kind"] == "attention"
              or (c["kind"] == "sdpa" and c.get("backend") == "auto"
                  and c.get("precision") != "fp32"))
    conv_math = sorted({numerics(c["precision"], device).conv for c in conv})
    out: list[Group] = [
        ("memory", memory, memory_params),
        ("gemm", gemm, gemm_params),
        ("gemm host", gemm_host, host_params),
        ("misaligned", misaligned,
         [(("gemm", "misaligned_factor", str(p)), "factor")
          for p in sorted({c["precision"] for c in misaligned})]),
        ("thin gemm", thin,
         [(("gemm", "thin_efficiency", str(p)), "efficiency")
          for p in sorted({c["precision"] for c in thin})]),
        # A linear layer's products in the layouts training uses, relative to the row-major
        # products above: forward (nt) and the weight gradient (tn).
        ("gemm layouts", of(lambda c: c["kind"] == "linear" and device.is_gpu) + layouts,
         [(("gemm", "layout_factors", "nt"), "factor"),
          (("gemm", "layout_factors", "tn"), "factor")]),
        ("conv", conv, [(("gemm", "conv_factors", m), "factor") for m in conv_math]
         + ([(("overhead", "cudnn_us"), "us")] if device.is_gpu and has_host(conv) else [])),
        ("batch norm", of(lambda c: c["kind"] == "batch_norm"),
         [(("memory", "kernel_factors", f), "factor") for f in sorted(
             {batch_norm("", 1, 1).family(numerics(c["precision"], device))
              for c in cases if c["kind"] == "batch_norm"})]),
        ("row kernels", rows,
         [(("memory", "kernel_factors", f), "factor") for f in row_families]),
        # What training gets: SDPA's own choice of backend (the "auto" cases), forward and
        # backward apart.
        ("attention", auto,
         [(("gemm", "attention_factor"), "factor"),
          (("gemm", "attention_backward_factor"), "factor"),
          *overhead_param("auto", [c for c in auto if c["kind"] == "sdpa"])]),
        *per_kernel,
        ("attention fp32", fp32_attention, kernel_params(FP32_ATTENTION, fp32_attention)),
        # Attention written out in PyTorch: its score-sized products and softmax together,
        # relative to a plain copy's rate (workload.attention.UNFUSED_ATTENTION).
        ("unfused attention", sdpa("unfused"),
         [(("memory", "kernel_factors", UNFUSED_ATTENTION), "factor")]),
        ("optimizer", of(lambda c: c["kind"] == "optimizer" and c["impl"] == "default"),
         [(("overhead", "optimizer_us"), "us"), (("overhead", "optimizer_tensor_us"), "us")]),
        ("pcie", of(lambda c: c["kind"] == "host_copy" and c["pinned"]),
         [(("pcie_efficiency",), "factor")]),
    ]
    if not device.is_gpu:  # a GPU's caching allocator reuses memory: no first-touch cost
        out.insert(1, ("first touch", of(lambda c: c["kind"] == "elementwise"
                                         and c["op"] == "add_alloc"),
                       [(("memory", "first_touch_gb_s"), "gb_s")]))
    return [g for g in out if g[1]]
