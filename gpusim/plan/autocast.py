"""Autocast's types, layer by layer, as PyTorch's mixed precision runs a model.

Only autocast's listed ops run in 16 bits: matrix products, convolutions and attention cast
their inputs (and fp32 weights) down. Ops on its fp32 list (layer norm, RMS norm, softmax)
compute and return fp32, and every other op (adds, dropout, activations, batch norm) keeps
its input's type, promoting to the wider of two. So a transformer's residual stream, which
starts at an fp32 embedding, stays fp32 throughout: its norms, adds and embedding dropout
move 4-byte elements, and each projection after a norm first casts its fp32 input to 16
bits. (Seen in a profiled GPT-2 step on an H100: layer-norm kernels on float, fp32 residual
adds, and a bf16 copy kernel before each such projection.) A CNN's stream stays 16-bit.

Megatron-style training (16-bit weights with fp32 master copies) keeps everything in 16
bits and casts nothing, as does FSDP's mixed precision (it gathers each unit's weights in the
16-bit type and casts the inputs once) and pure bf16 training (the model held in bf16), and
full-precision training has one type: all are left as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpusim.plan.job import TrainingJob
from gpusim.workload.attention import Attention, CrossEntropy, Embedding
from gpusim.workload.layers import Conv2d, Elementwise, Layer, Linear
from gpusim.workload.moe import MoE
from gpusim.workload.numerics import Numerics
from gpusim.workload.ops import DTYPE_BYTES, Op

FP32_LIST = frozenset({"layer_norm", "rms_norm", "softmax"})


@dataclass(frozen=True)
class LayerPrecision:
    """A layer's numerics (its activation type), and whether autocast first casts its
    fp32 input down to the compute type."""

    numerics: Numerics
    casts_input: bool = False


def autocasts(job: TrainingJob) -> bool:
    return (job.mixed_precision and not job.master_weights and not job.fsdp
            and not job.pure_bf16)


def casts_weight(layer: Layer, job: TrainingJob) -> bool:
    """Autocast runs matrix products and convolutions in the low precision, casting their
    fp32 weights once per forward (and caching the copy until backward); norms and
    embeddings keep fp32 weights, and frozen weights are held in the compute type already.
    A mixture of experts' router and stacked experts are products' weights like a linear
    layer's (bmm and grouped_mm are on autocast's low-precision list): an H100 profile of
    the models suite's MoE layer shows their casts down in forward and their gradients'
    casts back up in backward, 1.2 ms each way for 604M parameters."""
    return (autocasts(job) and layer.params > 0 and isinstance(layer, (Linear, Conv2d, MoE))
            and job.is_trainable(layer.name))


def cast_op(name: str, layer: str, elements: float, low_bytes: int, to_fp32: bool,
            flops: float = 0.0) -> Op:
    """Autocast's cast of ``elements`` from fp32 down to the compute type (``to_fp32``: of a
    gradient back up): one read, one write, the result newly allocated."""
    fp32 = DTYPE_BYTES["fp32"]
    return Op(name, "memory", flops, elements * (fp32 + low_bytes), "fp32", layer,
              alloc_bytes=elements * (fp32 if to_fp32 else low_bytes))


def input_elements(layer: Layer) -> int:
    """Elements per sample of the input a matrix product or convolution reads."""
    if isinstance(layer, Linear):
        return layer.rows * layer.in_features
    if isinstance(layer, Conv2d):
        return layer.in_channels * layer.height * layer.width
    return 0


def runs_in_fp8(layer: Layer, job: TrainingJob) -> bool:
    """Under fp8 training, the linear layers that frameworks convert (torchao's float8 and
    Transformer Engine's): projections whose dimensions fp8 kernels take (multiples of 16),
    not the output head, frozen ones too (TE runs every module under fp8_autocast, torchao
    converts by module, not by requires_grad: a LoRA's base computes in fp8), but not a
    QLoRA base held in 4 bits (dequantized to the compute type first); and a mixture of
    experts' experts where the stack runs them in fp8 (Stack.fp8_experts)."""
    if isinstance(layer, MoE):
        return (job.framework.fp8_experts and not layer.hidden % 16
                and not layer.ffn % 16)
    return (isinstance(layer, Linear) and not layer.name.startswith("head.")
            and not job.quantized(layer) and not layer.in_features % 16
            and not layer.out_features % 16)


def layer_precisions(job: TrainingJob) -> dict[str, LayerPrecision]:
    """Each layer's precision under the job's autocast (every layer the job's own otherwise);
    under fp8 training only the converted linear layers compute in fp8, the rest in bf16."""
    out = _autocast_precisions(job)
    if job.numerics().matmul != "fp8":
        return out
    for layer in job.model.layers:
        if not runs_in_fp8(layer, job):
            p = out[layer.name]
            out[layer.name] = replace(p, numerics=replace(p.numerics, matmul="bf16"))
    return out


def _autocast_precisions(job: TrainingJob) -> dict[str, LayerPrecision]:
    num = job.numerics()
    if not autocasts(job):
        return {layer.name: LayerPrecision(num) for layer in job.model.layers}
    low, wide = num.activation, "fp32"
    out: dict[str, LayerPrecision] = {}
    current = wide  # images and other dense inputs arrive in fp32
    stream = low  # the residual stream's type, once a layer has set it
    for layer in job.model.layers:
        casts = False
        if isinstance(layer, Embedding):
            act = current = stream = wide  # fp32 tables: an fp32 lookup
        elif isinstance(layer, (Linear, Conv2d)):
            casts = current == wide
            act = current = low
        elif isinstance(layer, Attention) and not layer.fused:
            # scores from a 16-bit product; softmax (on the fp32 list) keeps fp32 probabilities
            act = current = low
            out[layer.name] = LayerPrecision(replace(num, activation=act, softmax=wide))
            continue
        elif isinstance(layer, (Attention, CrossEntropy)):
            act = current = low  # inputs from a projection; the loss casts up itself
        elif isinstance(layer, Elementwise) and layer.op in FP32_LIST:
            act = current = stream = wide
        elif isinstance(layer, Elementwise) and layer.op == "add":
            act = current = stream = wide if wide in (current, stream) else current
        else:
            act = current
        out[layer.name] = LayerPrecision(replace(num, activation=act), casts)
    return out
