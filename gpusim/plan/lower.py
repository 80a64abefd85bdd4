"""Lowering: a training job becomes the ordered kernels of one step, each with its costs.

One microbatch is forward, then backward in reverse layer order (input gradient, then weight
gradient); with full activation checkpointing each block's forward runs again just before its
backward. The optimizer step follows the last microbatch. Under mixed precision, autocast
casts each weight to the compute type once per forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpusim.cost.kernels import copy_cost, host_cost, kernel_cost
from gpusim.hardware.calibration import Calibration, calibration_for
from gpusim.hardware.catalog import catalog
from gpusim.hardware.profile import GPUProfile, LinkProfile
from gpusim.plan.job import TrainingJob
from gpusim.workload.layers import Layer
from gpusim.workload.numerics import Numerics
from gpusim.workload.ops import DTYPE_BYTES, Op, Phase

# PyTorch's foreach optimizers handle about this many tensors per fused kernel launch.
TENSORS_PER_OPTIMIZER_KERNEL = 100


@dataclass(frozen=True, slots=True)
class Kernel:
    """One op with its device time and the host time it costs to dispatch."""

    name: str
    layer: str
    phase: Phase
    device_s: float
    host_s: float
    flops: float
    bytes: float
    bound: str


@dataclass(frozen=True)
class StepPlan:
    """What a step runs: ``accum`` identical microbatches, then the optimizer."""

    microbatch: tuple[Kernel, ...]
    optimizer: tuple[Kernel, ...]
    accum: int
    microbatch_size: int
    input_copy_s: float
    loader_s_per_microbatch: float
    loader_workers: int
    model_flops_per_step: float
    calibration: Calibration


def _first_trainable(job: TrainingJob) -> int:
    """Index of the first layer with trainable weights; backward stops there."""
    for i, layer in enumerate(job.model.layers):
        if layer.params and job.is_trainable(layer.name):
            return i
    return len(job.model.layers)


def _forward_ops(layer: Layer, job: TrainingJob, num: Numerics, phase: Phase) -> list[Op]:
    ops = []
    if job.mixed_precision and layer.params and job.device.is_gpu:
        # Read the fp32 weight, write its copy in the compute type.
        moved = layer.params * (DTYPE_BYTES["fp32"] + num.act_bytes)
        ops.append(Op(f"{layer.name}.cast_weight", "memory", 0.0, moved, "fp32", layer.name))
    ops += layer.forward(job.microbatch_size, num)
    return [op.with_phase(phase) for op in ops]


def microbatch_ops(job: TrainingJob) -> list[Op]:
    """Forward, recompute and backward ops of one microbatch, in issue order."""
    layers = job.model.layers
    num = job.numerics()
    n = job.microbatch_size
    first = _first_trainable(job)
    ops: list[Op] = []
    for layer in layers:
        ops += _forward_ops(layer, job, num, "forward")
    recomputed: set[str] = set()
    for i in range(len(layers) - 1, first - 1, -1):
        layer = layers[i]
        block = layer.block
        if job.checkpointing == "full" and block and block not in recomputed:
            recomputed.add(block)
            for other in layers[: i + 1]:
                if other.block == block:
                    ops += _forward_ops(other, job, num, "recompute")
        if i > first:
            ops += [op.with_phase("backward") for op in layer.backward_input(n, num)]
        if layer.params and job.is_trainable(layer.name):
            ops += [op.with_phase("backward") for op in layer.backward_weight(n, num)]
    return ops


def optimizer_ops(job: TrainingJob) -> list[Op]:
    """The optimizer step over trainable parameters, as foreach kernels."""
    trainable = [lay for lay in job.model.layers if lay.params and job.is_trainable(lay.name)]
    params = sum(lay.params for lay in trainable)
    if not params:
        return []
    # Bytes per parameter: read weight and gradient (fp32), read and write states, write weight.
    per_param = {"adam": 28, "adamw": 28, "sgd-momentum": 20, "sgd": 12}[job.optimizer]
    if job.precision == "fp16":
        per_param += 8  # GradScaler: unscale and check gradients for inf/nan
    tensors = sum(2 if getattr(lay, "bias", False) else 1 for lay in trainable)
    kernels = max(1, math.ceil(tensors / TENSORS_PER_OPTIMIZER_KERNEL))
    return [
        Op(f"optimizer.{job.optimizer}.{i}", "memory", 4.0 * params / kernels,
           per_param * params / kernels, "fp32", "optimizer", "optimizer")
        for i in range(kernels)
    ]


def _host_link(job: TrainingJob) -> LinkProfile | None:
    if not isinstance(job.device, GPUProfile) or job.loader_workers == 0:
        return None
    return catalog().get(f"pcie{min(job.device.pcie_gen, 5)}", LinkProfile)


def _to_kernel(op: Op, job: TrainingJob, cal: Calibration, host_s: float) -> Kernel:
    cost = kernel_cost(op, job.device, cal)
    return Kernel(op.name, op.layer, op.phase, cost.seconds, host_s, op.flops, op.bytes,
                  cost.bound)


def lower(job: TrainingJob) -> StepPlan:
    """The step plan of ``job``, every kernel costed for its device."""
    cal = calibration_for(job.device)
    host_s = host_cost(job.device, cal)
    ops = microbatch_ops(job)
    micro = tuple(_to_kernel(op, job, cal, host_s) for op in ops)
    opt = tuple(_to_kernel(op, job, cal, host_s) for op in optimizer_ops(job))
    n = job.microbatch_size
    link = _host_link(job)
    copy_s = 0.0
    if link is not None:
        copy_s = copy_cost(n * job.model.input.host_bytes, link.bandwidth, link.latency,
                           cal.pcie_efficiency)
    # Model FLOPs count forward and backward as executed; recompute is overhead, not progress.
    model_flops = job.grad_accum * sum(
        op.flops for op in ops if op.phase in ("forward", "backward")
    )
    return StepPlan(micro, opt, job.grad_accum, n, copy_s,
                    n * job.model.input.loader_cpu_s, job.loader_workers, model_flops, cal)
