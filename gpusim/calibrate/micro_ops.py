"""What gpusim predicts for each micro-suite case: the case rebuilt as ops of the workload.

The same layers and op rules the simulator uses for training make the prediction (a
convolution case is a ``Conv2d`` layer's forward or backward ops, an attention case a fused
``Attention`` layer's), so fitting these cases fits the model that predicts training steps.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from typing import Any

from gpusim import units
from gpusim.cost.kernels import (
    copy_cost,
    host_cost,
    kernel_cost,
    loop_seconds,
    optimizer_host_s,
)
from gpusim.hardware.calibration import Calibration, compiled_family
from gpusim.hardware.catalog import catalog, host_link
from gpusim.hardware.profile import DeviceProfile, GPUProfile
from gpusim.plan.autocast import cast_op, input_elements
from gpusim.plan.job import TrainingJob
from gpusim.plan.optimizer_step import OPTIMIZER_PASSES, pass_ops
from gpusim.validate.compare import LayerTiming, isolated_layer_times
from gpusim.workload.attention import Attention
from gpusim.workload.formats import model_from_spec
from gpusim.workload.layers import (
    Conv2d,
    Elementwise,
    Linear,
    batch_norm,
    gelu,
    layer_norm,
    rms_norm,
    swiglu,
)
from gpusim.workload.numerics import Numerics
from gpusim.workload.ops import (
    DTYPE_BYTES,
    GemmShape,
    Op,
    gemm_op,
    memory_op,
    result_bytes,
)

# Passes over the operand each elementwise case makes: (elements read, elements written).
ELEMENTWISE_PASSES = {"copy": (1, 1), "add": (2, 1), "add_alloc": (2, 1), "sum": (1, 0),
                      "cast": (1, 0.5)}  # fp32 in, bf16 (half an fp32 element) out


# The micro suite's row kernels as the zoo's layers (rows x columns of 16-bit activations):
# their kernel families' bandwidth factors are fitted on them.
ROW_KERNEL_LAYERS: dict[str, Callable[[str, int, int], Elementwise]] = {
    "layer_norm": lambda name, rows, cols: layer_norm(name, cols, rows),
    "rms_norm": lambda name, rows, cols: rms_norm(name, cols, rows),
    "gelu": lambda name, rows, cols: gelu(name, rows * cols),
    "silu_mul": lambda name, rows, cols: swiglu(name, rows * cols),
}


def row_layer(case: dict[str, Any]) -> Elementwise:
    """A row_kernel case as the zoo's layer: written as separate upcasting ops where the
    case says so (e.g. Hugging Face's RMS norm), run under torch.compile where it was
    (TorchInductor's generated kernels: as_compiled)."""
    row = ROW_KERNEL_LAYERS[case["op"]](case["id"], case["rows"], case["cols"])
    if case.get("upcast"):
        row = replace(row, upcast=case["upcast"])
    return row


def row_family(case: dict[str, Any], device: DeviceProfile) -> str:
    """The kernel family whose factor a row_kernel case measures."""
    family = row_layer(case).family(numerics(case["precision"], device))
    return compiled_family(family) if case.get("compiled") else family


def numerics(precision: str, device: DeviceProfile) -> Numerics:
    """As PyTorch runs a micro case: fp32 convolutions may use TF32 on a GPU (cuDNN's
    default); under autocast (fp16/bf16) everything runs in the low precision."""
    if precision == "fp32":
        conv = "tf32" if device.is_gpu and "tf32" in device.matrix_tflops else "fp32"
        return Numerics("fp32", conv, "fp32")
    if precision == "tf32":
        return Numerics("tf32", "tf32", "fp32")
    return Numerics(precision, precision, precision)


# What a case measured, which never changes the ops it runs.
_MEASURED = frozenset({"median_s", "p10_s", "p90_s", "repeats", "inner", "id", "chosen"})
_OPS: dict[tuple[Any, ...], tuple[DeviceProfile, list[Op]]] = {}


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def case_ops(case: dict[str, Any], device: DeviceProfile) -> list[Op]:
    """The ops a compute or memory case runs (empty for dispatch, launch and host copies),
    built once per case shape and device object (a fit predicts each case thousands of
    times)."""
    key = (id(device), *sorted((k, _frozen(v)) for k, v in case.items() if k not in _MEASURED))
    found = _OPS.get(key)
    if found is None or found[0] is not device:
        found = _OPS[key] = (device, _case_ops(case, device))
    return list(found[1])


def _case_ops(case: dict[str, Any], device: DeviceProfile) -> list[Op]:
    kind = case["kind"]
    if kind == "gemm":
        p = case["precision"]
        shape = GemmShape(case["m"], case["n"], case["k"], layout=case.get("layout", "nn"))
        # timed into a preallocated output (torch.mm(..., out=c)); fp8 writes bf16
        return [replace(gemm_op(case["id"], shape, p, result_bytes(p)), alloc_bytes=0.0)]
    if kind == "conv":
        num = numerics(case["precision"], device)
        layer = Conv2d(case["id"], case["in_channels"], case["out_channels"], case["kernel"],
                       case["height"], case["width"], case["stride"], case["padding"],
                       bias=bool(case["bias"]), channels_last=case.get("layout") == "nhwc")
        n = case["batch"]
        passes = {"forward": layer.forward, "backward_data": layer.backward_input,
                  "backward_filter": layer.backward_weight}
        # The suite runs 16-bit convolutions under autocast on fp32 tensors; a published
        # figure (a case with a source) times the convolution alone.
        autocast = case["precision"] in ("fp16", "bf16") and "source" not in case
        casts = _autocast_casts(layer, n, num, case["pass"] != "forward") if autocast else []
        if case["pass"] == "forward":
            return casts + layer.forward(n, num)
        if case["pass"] in passes:  # published figures of one backward product
            return passes[case["pass"]](n, num)
        return layer.backward_input(n, num) + layer.backward_weight(n, num) + casts
    if kind == "linear":
        num = numerics(case["precision"], device)
        linear = Linear(case["id"], case["in_features"], case["out_features"], case["tokens"],
                        bias=False)
        if case["pass"] == "forward":
            return linear.forward(1, num)
        return linear.backward_input(1, num) + linear.backward_weight(1, num)
    if kind == "sdpa" and case.get("backend") == "unfused":
        return _unfused_attention(case, numerics(case["precision"], device))
    if kind in ("attention", "sdpa"):
        num = numerics(case["precision"], device)
        att = Attention(case["id"], case["heads"], case["head_dim"], case["seq"],
                        kv_heads=case.get("kv_heads", 0), causal=case["causal"], fused=True,
                        kernel=SDPA_KERNELS.get(case.get("backend", ""), ""))
        n = case["batch"]
        ops = {"forward": att.forward(n, num), "backward": att.backward_input(n, num),
               "forward_backward": att.forward(n, num) + att.backward_input(n, num)
               }[case["pass"]]
        return [op for op in ops if op.kind == "attention"]  # SDPA on (b, h, s, d) alone
    if kind == "batch_norm":
        num = numerics(case["precision"], device)
        hw = case["height"]
        norm = batch_norm(case["id"], case["channels"], case["channels"] * hw * hw)
        n = case["batch"]
        return norm.forward(n, num) if case["pass"] == "forward" else norm.backward_input(n, num)
    if kind == "row_kernel" and case["op"] in ROW_KERNEL_LAYERS:
        row = row_layer(case)
        num = numerics(case["precision"], device)
        if case.get("compiled"):
            # one generated kernel each way, over the fused form's passes
            row = replace(row, upcast="")
        ops = {"forward": row.forward(1, num), "backward": row.backward_input(1, num),
               "forward_backward": row.forward(1, num) + row.backward_input(1, num)
               }[case["pass"]]
        return ([replace(op, family=compiled_family(op.family)) for op in ops]
                if case.get("compiled") else ops)
    if kind == "elementwise":
        reads, writes = ELEMENTWISE_PASSES[case["op"]]
        elements = case["bytes"] / DTYPE_BYTES[case["dtype"]]
        return [memory_op(case["id"], reads * elements, writes * elements,
                          DTYPE_BYTES[case["dtype"]], allocates=case["op"] == "add_alloc")]
    return []


# SDPA's backends by the names gpusim gives their kernels (torch >= 2.2's flash backend is
# FlashAttention-2); "auto" (SDPA's own choice) is the calibration's default kernel.
# "triton" is no SDPA backend: FlashAttention's own Triton implementation
# (flash_attn_triton.py, which llm-foundry runs as attn_impl: triton), timed in published
# figures only.
SDPA_KERNELS = {"flash": "flash2", "cudnn": "cudnn", "efficient": "efficient",
                "triton": "triton"}


def _unfused_attention(case: dict[str, Any], num: Numerics) -> list[Op]:
    """Attention written out in PyTorch (FlashAttention's benchmarks' "Pytorch" baseline:
    the scaled QK^T product, a causal mask added where causal, softmax, the product with V,
    the heads merged; their gradients): the unfused Attention layer's kernels, and the
    mask's pass over the scores."""
    att = Attention(case["id"], case["heads"], case["head_dim"], case["seq"],
                    kv_heads=case.get("kv_heads", 0), causal=case["causal"], fused=False)
    n = case["batch"]
    scores = n * case["heads"] * case["seq"] ** 2
    mask = [memory_op(f"{case['id']}.causal_mask", scores, scores, num.act_bytes, 1)
            ] if case["causal"] else []
    forward, backward = att.forward(n, num) + mask, att.backward_input(n, num)
    return {"forward": forward, "backward": backward,
            "forward_backward": forward + backward}[case["pass"]]


def _autocast_casts(layer: Conv2d, batch: int, num: Numerics, backward: bool) -> list[Op]:
    """What autocast adds to a convolution the micro suite runs on an fp32 input with an fp32
    module (measure.micro.time_conv): the input's and the weight's casts down to the
    compute type, or in backward their gradients' casts back up to fp32 (as
    plan.lower costs them in training)."""
    elements = {"input": batch * input_elements(layer), "weight": layer.params}
    suffix = "_grad" if backward else ""
    return [cast_op(f"{layer.name}.cast_{what}{suffix}", layer.name, e, num.act_bytes,
                    to_fp32=backward) for what, e in elements.items()]


def _optimizer_step(case: dict[str, Any], device: DeviceProfile, cal: Calibration) -> float:
    """A step of PyTorch's default Adam over ``tensors`` equal tensors: host (step() itself
    and each kernel's dispatch) and kernels overlap, as in any loop."""
    sizes = [case["params"] // case["tensors"]] * case["tensors"]
    ops = pass_ops(list(OPTIMIZER_PASSES[case["optimizer"]]), sizes, device.is_gpu)
    host = host_cost(device, cal) * len(ops) + optimizer_host_s(case["tensors"], cal)
    kernels = sum(kernel_cost(op, device, cal).seconds for op in ops)
    return max(host, kernels) if device.is_gpu else host + kernels


def layer_host_job(case: dict[str, Any], device: DeviceProfile) -> TrainingJob:
    """The tiny model of a layer_host case, as the job whose layers it timed."""
    return TrainingJob(model_from_spec(case["model"]), device, case["batch_size"],
                       case["precision"], optimizer="adam", loader_workers=0)


@lru_cache(maxsize=64)
def _layer_times(spec: str, batch: int, precision: str, device: str,
                 cal: str) -> dict[tuple[str, str], LayerTiming]:
    job = layer_host_job({"model": json.loads(spec), "batch_size": batch,
                          "precision": precision}, catalog().find(device))  # type: ignore[arg-type]
    return isolated_layer_times(job, Calibration.model_validate_json(cal))


def layer_host_times(case: dict[str, Any], device: DeviceProfile,
                     cal: Calibration) -> LayerTiming:
    """The kernels of the layer and phase a layer_host case timed (one lowering of the
    tiny model per calibration, cached)."""
    layer, phase = case["pass"].rsplit("/", 1)
    times = _layer_times(json.dumps(case["model"], sort_keys=True), case["batch_size"],
                         case["precision"], device.name, cal.model_dump_json())
    return times[(layer, phase)]


def looped_case(case: dict[str, Any]) -> bool:
    """Whether a case's call was timed in a loop (``inner`` calls a sample), not alone."""
    return int(case.get("inner", 1)) > 1


def kernel_timed(case: dict[str, Any]) -> bool:
    """Whether a case's time is its kernels' alone: replayed from a CUDA graph, or a
    published figure timed on the device (measure/published.py)."""
    return bool(case.get("graph")) or case.get("timed") == "kernel"


def predict(case: dict[str, Any], device: DeviceProfile, cal: Calibration) -> float:
    """Seconds gpusim predicts for one micro case under calibration ``cal``."""
    kind = case["kind"]
    if kind == "layer_host":
        return layer_host_times(case, device, cal).seconds(device.is_gpu, looped_case(case))
    if kind == "optimizer":
        return _optimizer_step(case, device, cal)
    if kind == "dispatch":
        return host_cost(device, cal)
    if kind == "autograd":
        node = host_cost(device, cal, autograd=True)
        extra = {"module": cal.overhead.module_us, "backward_call": cal.overhead.backward_call_us}
        return node + extra.get(case["pass"], 0.0) * 1e-6
    if kind == "launch":
        return kernel_cost(memory_op("launch", 1, 1, 4), device, cal).seconds
    if kind == "host_copy":
        if not isinstance(device, GPUProfile):
            raise ValueError("host copies are measured on GPUs only")
        link = host_link(device)
        return copy_cost(case["bytes"], link.bandwidth, link.latency, cal.pcie_efficiency)
    if kernel_timed(case):
        return sum(kernel_cost(op, device, cal).seconds for op in case_ops(case, device))
    seconds = loop_seconds(case_ops(case, device), device, cal)
    if case.get("pass") in ("backward", "forward_backward"):
        # Timed with one backward() call per sample (measure.micro; the GPU probes' forward
        # and backward), which pays the call's own cost: entering the autograd engine and
        # waiting for it.
        seconds += units.us(cal.overhead.backward_call_us)
    return seconds
