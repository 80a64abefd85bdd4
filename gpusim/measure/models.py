"""The models suite: whole training steps, per-layer forward and backward, and peak memory.

Never fitted, only compared. Each case is a zoo model (or a transformer by dimensions) at a
batch size and precision; the step is ``zero_grad``, forward with the loss, backward and the
optimizer, as a training loop runs it, on synthetic data already on the device.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gpusim.measure.timing import Timing, synchronize, time_call
from gpusim.measure.torch_model import LayerCall, Network, embedding_ids, loss_target
from gpusim.workload.attention import CrossEntropy, Embedding
from gpusim.workload.formats import model_from_spec
from gpusim.workload.model import Model

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}

# A stack of Llama-style blocks (RMSNorm, SwiGLU, grouped-query attention), by dimensions.
LLAMA_BLOCKS_GPU = {"name": "llama-blocks", "transformer": {
    "layers": 4, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336,
    "vocab": 128256, "norm": "rmsnorm", "activation": "swiglu", "positions": "rotary",
    "tied_embeddings": False, "bias": False}}
# Blocks of a Qwen3-30B-A3B-like mixture of experts (128 experts of 768, top 8).
MOE_BLOCKS_GPU = {"name": "moe-blocks", "transformer": {
    "layers": 4, "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128,
    "ffn_hidden": 6144, "vocab": 151936, "norm": "rmsnorm", "activation": "swiglu",
    "positions": "rotary", "tied_embeddings": False, "bias": False, "experts": 128,
    "top_k": 8, "moe_ffn": 768}}
MOE_BLOCKS_CPU = {"name": "moe-blocks-small", "transformer": {
    "layers": 2, "hidden": 512, "heads": 8, "kv_heads": 2, "ffn_hidden": 1024,
    "vocab": 32000, "norm": "rmsnorm", "activation": "swiglu", "positions": "rotary",
    "tied_embeddings": False, "bias": False, "experts": 8, "top_k": 2, "moe_ffn": 256}}
LLAMA_BLOCKS_CPU = {"name": "llama-blocks-small", "transformer": {
    "layers": 2, "hidden": 2048, "heads": 16, "kv_heads": 4, "ffn_hidden": 5632,
    "vocab": 32000, "norm": "rmsnorm", "activation": "swiglu", "positions": "rotary",
    "tied_embeddings": False, "bias": False}}


@dataclass(frozen=True)
class ModelCase:
    spec: dict[str, Any]
    batch_size: int
    precision: str
    optimizer: str = "adam"
    tags: tuple[str, ...] = field(default=())

    @property
    def id(self) -> str:
        name = self.spec.get("zoo") or self.spec.get("name")
        size = [f"s{self.spec['seq_len']}"] if "seq_len" in self.spec else []
        size += [f"{self.spec['image_size']}px"] if "image_size" in self.spec else []
        return "/".join([str(name), *size, self.precision, f"b{self.batch_size}"])


def _cases(rows: list[tuple[dict[str, Any], list[int], list[str]]]) -> list[ModelCase]:
    return [ModelCase(spec, b, p) for spec, batches, precs in rows for p in precs
            for b in batches]


def gpu_cases() -> list[ModelCase]:
    both = ["fp32", "bf16"]
    return _cases([
        ({"zoo": "mnist-mlp"}, [64, 512], both),
        ({"zoo": "mnist-cnn"}, [64, 256], both),
        ({"zoo": "vgg16"}, [32, 64], both),
        ({"zoo": "resnet50"}, [64, 128], both),
        ({"zoo": "bert-base", "seq_len": 128}, [16, 32], both),
        ({"zoo": "gpt2", "seq_len": 1024}, [4, 8], both),
        ({"zoo": "gpt2-medium", "seq_len": 1024}, [4], ["bf16"]),
        ({**LLAMA_BLOCKS_GPU, "seq_len": 2048}, [1, 2], ["bf16"]),
        ({**MOE_BLOCKS_GPU, "seq_len": 4096}, [1, 2], ["bf16"]),
    ])


def cpu_cases() -> list[ModelCase]:
    """Smaller inputs and batches, so the suite runs in minutes on a few cores."""
    return _cases([
        ({"zoo": "mnist-mlp"}, [64, 256], ["fp32", "bf16"]),
        ({"zoo": "mnist-cnn"}, [16, 64], ["fp32"]),
        ({"zoo": "mnist-cnn"}, [16], ["bf16"]),
        ({"zoo": "resnet50", "image_size": 64}, [2, 4], ["fp32"]),
        ({"zoo": "resnet50", "image_size": 64}, [2], ["bf16"]),
        ({"zoo": "vgg16", "image_size": 32}, [2, 8], ["fp32"]),
        ({"zoo": "bert-base", "seq_len": 64}, [1, 2], ["fp32"]),
        ({"zoo": "bert-base", "seq_len": 64}, [1], ["bf16"]),
        ({"zoo": "gpt2", "seq_len": 64}, [1, 2], ["fp32"]),
        ({"zoo": "gpt2", "seq_len": 64}, [1], ["bf16"]),
        ({"zoo": "gpt2-medium", "seq_len": 64}, [1], ["fp32"]),
        ({**LLAMA_BLOCKS_CPU, "seq_len": 64}, [1], ["fp32", "bf16"]),
        ({**MOE_BLOCKS_CPU, "seq_len": 64}, [1], ["fp32", "bf16"]),
    ])


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Mixed precision as training scripts use it: autocast around forward and the loss."""
    if precision in DTYPES:
        return torch.autocast(device.type, dtype=DTYPES[precision])
    return contextlib.nullcontext()


def set_precision_flags(precision: str, device: torch.device) -> None:
    """PyTorch's defaults (cuBLAS fp32, cuDNN may use TF32), or TF32 everywhere for tf32."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = True


def _first_trainable(model: Model) -> int:
    return next((i for i, layer in enumerate(model.layers) if layer.params), len(model.layers))


def _layer_inputs(call: LayerCall, model: Model, batch: int,
                  device: torch.device) -> list[torch.Tensor]:
    """Fresh random inputs shaped as the layer saw them in the recorded forward pass."""
    layer = model.layers[call.index]
    wants_grad = call.index > _first_trainable(model)
    out = []
    for shape, dtype in zip(call.shapes, call.dtypes, strict=True):
        if dtype in (torch.int64, torch.int32):
            assert isinstance(layer, Embedding)
            out.append(embedding_ids(layer, batch, device, first=call.role == "embed"))
        else:
            out.append(torch.randn(shape, device=device, dtype=dtype)
                       .requires_grad_(wants_grad))
    return out


def _layer_forward(call: LayerCall, net: Network, model: Model, batch: int,
                   inputs: list[torch.Tensor], device: torch.device) -> Callable[[], Any]:
    mod = net.mods[call.index]
    layer = model.layers[call.index]
    if call.role == "add":
        return lambda: inputs[0] + inputs[1]
    if call.role == "embed_add":
        return lambda: inputs[1] + mod(inputs[0])
    if call.role == "loss":
        assert isinstance(layer, CrossEntropy)
        target = loss_target(layer, batch, device)
        return lambda: mod(inputs[0], target)
    return lambda: mod(inputs[0])


def measure_layers(net: Network, case: ModelCase, device: torch.device,
                   repeats: int) -> list[dict[str, Any]]:
    """Forward and backward of each layer alone, on inputs of the shapes it saw."""
    return [_time_layer(call, net, case, device, repeats)
            for call in net.record_calls(autocast(case.precision, device))]


def _time_layer(call: LayerCall, net: Network, case: ModelCase, device: torch.device,
                repeats: int) -> dict[str, Any]:
    model = net.model
    inputs = _layer_inputs(call, model, case.batch_size, device)
    forward = _layer_forward(call, net, model, case.batch_size, inputs, device)
    params = list(net.mods[call.index].parameters())
    state: dict[str, Any] = {}

    def run_forward() -> Any:
        with autocast(case.precision, device):
            return forward()

    def setup() -> None:
        """Untimed: clear gradients (as zero_grad does) and run the forward to backpropagate."""
        for t in [*params, *inputs]:
            t.grad = None
        state["out"] = run_forward()
        state["grad"] = None if state["out"].dim() == 0 else torch.randn_like(state["out"])

    def backward() -> None:
        state["out"].backward(state["grad"])

    row: dict[str, Any] = {"layer": model.layers[call.index].name, "role": call.role,
                           "forward": time_call(run_forward, device, repeats=repeats).to_dict()}
    if run_forward().requires_grad:
        row["backward"] = time_call(backward, device, setup=setup, repeats=repeats).to_dict()
    return row


STEP_PHASES = ("zero_grad", "forward", "backward", "optimizer")


def measure_step(net: Network, case: ModelCase, device: torch.device, repeats: int
                 ) -> tuple[Timing, int | None, int | None, dict[str, Timing]]:
    """The whole training step; peak memory allocated and reserved by PyTorch's caching
    allocator (CUDA only) over the timed steps; on a CPU, where the host's clock is the
    device's, each phase of the timed steps too (on a GPU, timing them would need a
    synchronization that changes the step)."""
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler(device.type) if case.precision == "fp16" else None
    on_cpu = device.type == "cpu"
    marks: list[list[float]] = []

    def step() -> None:
        mark = [time.perf_counter()] if on_cpu else []
        opt.zero_grad(set_to_none=True)
        mark += [time.perf_counter()] if on_cpu else []
        with autocast(case.precision, device):
            loss = net()
        mark += [time.perf_counter()] if on_cpu else []
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            mark += [time.perf_counter()] if on_cpu else []
            opt.step()
        if on_cpu:
            marks.append([*mark, time.perf_counter()])

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timing = time_call(step, device, repeats=repeats, loop=False)
    synchronize(device)
    timed = marks[-timing.repeats:]  # the samples, after the warm-up calls
    phases = {name: Timing.of([m[i + 1] - m[i] for m in timed])
              for i, name in enumerate(STEP_PHASES)} if timed and scaler is None else {}
    if device.type != "cuda":
        return timing, None, None, phases
    return (timing, int(torch.cuda.max_memory_allocated(device)),
            int(torch.cuda.max_memory_reserved(device)), phases)


def measure_case(case: ModelCase, device: torch.device, repeats: int,
                 layers: bool = True) -> dict[str, Any]:
    set_precision_flags(case.precision, device)
    model = model_from_spec(case.spec)
    torch.manual_seed(0)
    net = Network(model, case.batch_size, device, inplace=True)
    step, peak, reserved, phases = measure_step(net, case, device, repeats)
    row: dict[str, Any] = {
        "id": case.id, "kind": "training_step", "model": case.spec,
        "batch_size": case.batch_size, "precision": case.precision,
        "optimizer": case.optimizer, "step": step.to_dict(), "peak_memory_bytes": peak,
        "peak_reserved_bytes": reserved,
    }
    if phases:  # on a CPU: zero_grad, forward with the loss, backward, optimizer
        row["phases"] = {name: t.to_dict() for name, t in phases.items()}
    backends = sorted({str(getattr(m, "sdpa_backend", "")) for m in net.modules()} - {""})
    if backends:  # which SDPA kernel the step's attention layers ran
        row["sdpa_backends"] = backends
    if layers:
        row["layers"] = measure_layers(Network(model, case.batch_size, device, inplace=False),
                                       case, device, repeats)
    del net
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row
