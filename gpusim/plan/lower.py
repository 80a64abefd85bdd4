"""Lowering: a training job becomes the ordered kernels of one step, each with its costs.

One microbatch is forward, then backward in reverse layer order (input gradient, then weight
gradient); with full activation checkpointing each block's forward runs again just before its
backward, with selective checkpointing only each attention core's. The optimizer step follows
the last microbatch. Under mixed precision, autocast casts each weight to the compute type
once per forward (unless the model keeps its weights in that type, with fp32 master copies).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from gpusim import units
from gpusim.cost.energy import active_seconds
from gpusim.cost.kernels import (
    copy_cost,
    host_cost,
    kernel_cost,
    op_host_extra,
    optimizer_host_s,
)
from gpusim.hardware.calibration import Calibration, calibration_for, compiled_family
from gpusim.hardware.catalog import host_link
from gpusim.hardware.profile import GPUProfile, LinkProfile
from gpusim.plan.autocast import (
    LayerPrecision,
    cast_op,
    casts_weight,
    input_elements,
    layer_precisions,
)
from gpusim.plan.job import TrainingJob
from gpusim.plan.offload import offload_seconds
from gpusim.plan.optimizer_step import (
    OPTIMIZER_PASSES,
    optimizer_ops,
    parameter_tensors,
    step_in_backward_ops,
)
from gpusim.plan.recompute import (
    activation_only,
    checkpointed_blocks,
    policy_saved,
    recomputed_moe,
    recomputed_norm,
    rerun_with,
    selective_modules,
)
from gpusim.stack import runs_compiled
from gpusim.workload.attention import Attention, CrossEntropy, Embedding
from gpusim.workload.layers import Conv2d, Elementwise, Layer, Linear
from gpusim.workload.numerics import Numerics
from gpusim.workload.ops import Op, Phase, memory_op


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
    active_s: float  # time at the roofline limit, which draws power (see cost/energy.py)
    syncs: bool = False  # the host waits for the device before dispatching it (Op.syncs)


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
    # the host reads a value from the device (a gradient norm, an overflow flag) before it
    # dispatches the optimizer step, so the device drains its queue first
    sync_before_optimizer: bool = False

    @property
    def active_s_per_step(self) -> float:
        """Device seconds per step at the roofline limit (what draws power above idle)."""
        return (self.accum * sum(k.active_s for k in self.microbatch)
                + sum(k.active_s for k in self.optimizer))


def _first_trainable(job: TrainingJob) -> int:
    """Index of the first layer with trainable weights; backward stops there (unless the
    input itself needs a gradient)."""
    if job.input_requires_grad:
        return -1
    for i, layer in enumerate(job.model.layers):
        if job.trains_weights(layer):
            return i
    return len(job.model.layers)


def _input_cast(layer: Layer, job: TrainingJob, num: Numerics, backward: bool) -> list[Op]:
    """Autocast's cast of an fp32 input down to the compute type (in backward, of the
    input's gradient back up to fp32)."""
    e = job.microbatch_size * input_elements(layer)
    # memory_op's FLOPs (one an element written)
    return [cast_op(f"{layer.name}.cast_input{'_grad' if backward else ''}", layer.name, e,
                    num.act_bytes, to_fp32=backward, flops=1.0 * e)]


def _forward_ops(layer: Layer, job: TrainingJob, prec: LayerPrecision,
                 phase: Phase, weight_cast: bool) -> list[Op]:
    num = prec.numerics
    ops = _input_cast(layer, job, num, backward=False) if prec.casts_input else []
    if weight_cast:
        # Read the fp32 weight, write its copy in the compute type (no FLOPs): the job's
        # 16-bit type also where the layer's activations stay fp32 (a mixture of experts
        # gathers its fp32 input's copies before its products cast them)
        ops.append(cast_op(f"{layer.name}.cast_weight", layer.name, layer.params,
                           job.numerics().act_bytes, to_fp32=False))
    ops += _dequantize(layer, job, num)
    if isinstance(layer, CrossEntropy) and job.master_weights and not layer.fused:
        ops += layer.vocab_parallel_forward(job.microbatch_size, num)
    else:
        ops += layer.forward(job.microbatch_size, num)
    return [op.with_phase(phase) for op in ops]


def _dequantize(layer: Layer, job: TrainingJob, num: Numerics) -> list[Op]:
    """A 4-bit base weight (QLoRA) unpacked to the compute type before each product that
    reads it (bitsandbytes dequantizes, then multiplies; the copy is freed after)."""
    if not job.quantized(layer):
        return []
    packed = layer.params * job.frozen_bytes(layer)
    op = memory_op(f"{layer.name}.dequantize", 0, layer.params, num.act_bytes, 2.0,
                   layer=layer.name)
    return [replace(op, bytes=packed + layer.params * num.act_bytes)]


def _input_grad_ops(layer: Layer, job: TrainingJob, prec: LayerPrecision) -> list[Op]:
    num = prec.numerics
    if isinstance(layer, CrossEntropy) and job.master_weights and not layer.fused:
        return layer.vocab_parallel_backward(job.microbatch_size, num)
    ops = _dequantize(layer, job, num) + layer.backward_input(job.microbatch_size, num)
    return ops + (_input_cast(layer, job, num, backward=True) if prec.casts_input else [])


def _weight_grad_ops(layer: Layer, job: TrainingJob, num: Numerics,
                     weight_cast: bool) -> list[Op]:
    """The weight gradient, then (under autocast) its cast back to an fp32 gradient."""
    ops = layer.backward_weight(job.microbatch_size, num)
    if weight_cast:
        ops.append(cast_op(f"{layer.name}.cast_grad", layer.name, layer.params,
                           job.numerics().act_bytes, to_fp32=True))
    return ops


# What a step of a microbatch does to one layer: its forward, its forward again under
# recompute, its input gradient, its weight gradient.
StepKind = Literal["forward", "recompute", "input_grad", "weight_grad"]


def microbatch_steps(job: TrainingJob) -> list[tuple[int, StepKind]]:
    """The layer steps of one microbatch in issue order, as (layer index, kind): every
    forward, then backward from the last layer, each checkpointed block re-run before its
    first layer's gradients."""
    layers = job.model.layers
    first = _first_trainable(job)
    steps: list[tuple[int, StepKind]] = [(i, "forward") for i in range(len(layers))]
    recomputed: set[str] = set()
    checkpointed = checkpointed_blocks(job.checkpointing, job.model)
    modules = selective_modules(job.checkpointing)
    # each block's layer indices, where a module re-runs part of a block (mla_up_proj, mlp)
    block_members: dict[str, list[int]] = defaultdict(list)
    if modules & {"mla_up_proj", "mlp"}:
        for j, la in enumerate(layers):
            if la.block:
                block_members[la.block].append(j)
    for i in range(len(layers) - 1, max(first, 0) - 1, -1):
        layer = layers[i]
        block = layer.block
        if block in checkpointed and block not in recomputed:
            recomputed.add(block)
            members = [j for j in range(i + 1) if layers[j].block == block]
            saved = policy_saved(job.checkpointing, [layers[j] for j in members])
            steps += [(j, "recompute") for j in members if layers[j].name not in saved]
        if "core_attn" in modules and isinstance(layer, Attention):
            steps.append((i, "recompute"))
        # output-discarding recompute: the input's norm and the experts' activation run
        # again as the experts' backward starts
        if i > 0 and recomputed_norm(layers[i - 1], layer, modules):
            steps.append((i - 1, "recompute"))
        if recomputed_moe(layer, modules):
            steps.append((i, "recompute"))
        if block in block_members:
            members = block_members[block]
            again = {la.name for la in rerun_with(layer, [layers[j] for j in members],
                                                  modules)}
            steps += [(j, "recompute") for j in members if layers[j].name in again]
        if i > first:
            steps.append((i, "input_grad"))
        if job.trains_weights(layer):
            steps.append((i, "weight_grad"))
    return steps


def lower_step(layer: Layer, kind: StepKind, job: TrainingJob, prec: LayerPrecision,
               traits: tuple[bool, bool] | None = None) -> list[Op]:
    """The kernels of one layer step (see microbatch_steps). ``traits``: the layer's
    _layer_traits, where the caller has them already."""
    weight_cast, compiled = _layer_traits(layer, job) if traits is None else traits
    if kind == "recompute" and activation_only(layer, job.checkpointing):
        ops = [op.with_phase("recompute") for op in layer.forward(job.microbatch_size,
                                                                   prec.numerics)
               if op.name == f"{layer.name}.act"]
    elif kind in ("forward", "recompute"):
        ops = _forward_ops(layer, job, prec, kind, weight_cast)
    elif kind == "input_grad":
        ops = [op.with_phase("backward") for op in _input_grad_ops(layer, job, prec)]
    else:
        ops = [op.with_phase("backward")
               for op in _weight_grad_ops(layer, job, prec.numerics, weight_cast)]
    return _as_compiled(ops) if compiled else ops


def _layer_traits(layer: Layer, job: TrainingJob) -> tuple[bool, bool]:
    """Whether autocast casts the layer's weight, and whether it runs compiled."""
    return casts_weight(layer, job), runs_compiled(layer, job.framework)


# Kernels TorchInductor folds into the kernel that produces their input: autocast's cast of
# an activation (or its gradient) to another type, and the amax a tensorwise fp8 scale
# takes of an activation or an output gradient (a weight's, a graph input, stays its own).
_FUSED_INTO_PRODUCER = (".cast_input", ".cast_input_grad", ".x.amax", ".dy.amax")


def _as_compiled(ops: list[Op]) -> list[Op]:
    """A block's layer step's kernels under torch.compile: the casts and reductions above folded
    into their producers, and the norm and activation kernels left run as Inductor
    generates them (family ``<family>_compiled``, calibration's kernel_factors: on an H100
    its RMS norm ran as fast as eager PyTorch's fused one, and its silu*mul 1.4x faster
    forward, 1.2x slower backward); plain passes keep a copy's rate."""
    return [replace(op, family=compiled_family(op.family)) if op.kind == "memory" else op
            for op in ops if not op.name.endswith(_FUSED_INTO_PRODUCER)]


def microbatch_ops(job: TrainingJob) -> list[Op]:
    """Forward, recompute and backward ops of one microbatch, in issue order (with the
    optimizer stepping in backward, each layer's step right after its weight gradient)."""
    layers = job.model.layers
    precision = layer_precisions(job)
    traits = [_layer_traits(layer, job) for layer in layers]
    ops = []
    for i, kind in microbatch_steps(job):
        ops += lower_step(layers[i], kind, job, precision[layers[i].name], traits[i])
        if kind == "weight_grad" and job.optimizer_in_backward:
            ops += step_in_backward_ops(job, layers[i])
    return ops


def _host_link(job: TrainingJob) -> LinkProfile | None:
    if not isinstance(job.device, GPUProfile) or job.loader_workers == 0:
        return None
    return host_link(job.device)


CostKey = tuple[object, ...]


def _device_costs(job: TrainingJob, cal: Calibration
                  ) -> Callable[[Op], tuple[float, str, float]]:
    """``op``'s (device seconds, bound, active seconds) on the job's device, each distinct op
    costed once: kernel_cost reads no op's name, layer or phase, so the same kernel in
    another layer (a model's repeated blocks) or pass (recompute) costs the same. The
    memo lives as long as the function, one lowering."""
    device = job.device
    memo: dict[CostKey, tuple[float, str, float]] = {}

    def cost(op: Op) -> tuple[float, str, float]:
        key = (op.kind, op.flops, op.bytes, op.math, op.gemm, op.alloc_bytes, op.family,
               op.parallel_units, op.kernel, op.attention)
        found = memo.get(key)
        if found is None:
            c = kernel_cost(op, device, cal)
            found = memo[key] = (c.seconds, c.bound, active_seconds(c))
        return found

    return cost


def _kernel(op: Op, cost: Callable[[Op], tuple[float, str, float]], host_s: float) -> Kernel:
    """``op`` as a kernel: its device time from ``cost``, dispatched in ``host_s``."""
    seconds, bound, active = cost(op)
    return Kernel(op.name, op.layer, op.phase, seconds, host_s, op.flops, op.bytes, bound,
                  active, op.syncs)


def layer_kind(layer: Layer) -> str:
    """The kind of layer whose host cost calibration states (layer_us): its op for
    elementwise layers, else its class."""
    if isinstance(layer, Elementwise):
        return layer.op or "elementwise"
    if isinstance(layer, Attention):
        return "attention" if layer.fused else "attention_unfused"
    return {Linear: "linear", Conv2d: "conv", Embedding: "embedding",
            CrossEntropy: "cross_entropy"}.get(type(layer), type(layer).__name__.lower())


def _syncs_before_step(job: TrainingJob) -> bool:
    """Whether the host waits for the device before the optimizer step: the stack reads a
    value there, or PyTorch's GradScaler does under fp16 autocast (torch/amp/grad_scaler.py,
    GradScaler._maybe_opt_step: ``sum(v.item() for v in found_inf_per_device.values())``
    decides whether optimizer.step() runs)."""
    grad_scaler = job.precision == "fp16" and not job.master_weights
    return job.device.is_gpu and (job.framework.sync_before_step or grad_scaler)


def lower(job: TrainingJob, calibration: Calibration | None = None) -> StepPlan:
    """The step plan of ``job``, every kernel costed for its device (under ``calibration``
    when given, else the device's own) at the rates its products sustain over a step."""
    cal = (calibration or calibration_for(job.device)).sustained()
    host_s = host_cost(job.device, cal)
    training_host_s = host_cost(job.device, cal, autograd=True)
    # A compiled block's wrapper launches its kernels one after another: no per-op
    # dispatch, autograd node or module call in Python, only each launch.
    compiled = {la.name for la in job.model.layers if runs_compiled(la, job.framework)}
    launch_s = units.us(cal.overhead.launch_us)
    ops = microbatch_ops(job)
    kinds = {layer.name: layer_kind(layer) for layer in job.model.layers}
    cost = _device_costs(job, cal)
    # Host time outside any op: calling each layer's module in forward (and its ops that
    # launch nothing), its autograd nodes in backward (neither for the ``compiled`` layers),
    # and entering the autograd engine once per backward pass (each charged to the layer's
    # or pass's first kernel). The optimizer kernels inside backward take an optimizer's
    # host cost instead: each parameter's own step() in Python (a fixed cost and one
    # tensor's), spread over that step's kernels.
    each_in_backward = 0.0
    if job.optimizer_in_backward:
        each_in_backward = optimizer_host_s(1, cal) / len(OPTIMIZER_PASSES[job.optimizer])
    seen: set[tuple[str, str]] = set()
    backward_started = False
    micro_kernels = []
    for op in ops:
        phase, name = op.phase, op.layer
        kernel_host_s = ((launch_s if name in compiled else training_host_s)
                         + op_host_extra(op, cal))
        extra = 0.0
        if (phase in ("forward", "recompute", "backward") and (phase, name) not in seen
                and name not in compiled):
            seen.add((phase, name))
            extra += cal.overhead.layer_call_us(kinds.get(name, ""), phase)
        if phase == "backward" and not backward_started:
            backward_started = True
            extra += cal.overhead.backward_call_us
        if extra:
            kernel_host_s = kernel_host_s + units.us(extra)
        if job.optimizer_in_backward and phase == "optimizer":
            kernel_host_s = host_s + each_in_backward
        micro_kernels.append(_kernel(op, cost, kernel_host_s))
    micro = tuple(micro_kernels)
    opt_ops = [] if job.optimizer_in_backward else optimizer_ops(job)
    opt: tuple[Kernel, ...] = ()
    if opt_ops and job.offload != "none" and isinstance(job.device, GPUProfile):
        # The step runs on the host: gradients down, CPU Adam, weights up, in turn.
        trainable = sum(la.params for la in job.model.layers if job.is_trainable(la.name))
        seconds = offload_seconds(trainable, job.grad_bytes, job.numerics().act_bytes,
                                  job.device, None, cal)
        opt = (Kernel("optimizer.offloaded_step", "optimizer", "optimizer", seconds, host_s,
                      0.0, trainable * (job.grad_bytes + job.numerics().act_bytes), "pcie",
                      0.0),)
    elif opt_ops:
        # torch.optim's step() in Python (not Megatron-LM's, with master weights): a fixed
        # cost, and per parameter tensor the list building and grouping its foreach kernels
        # take, spread over its kernels (the Python runs between the launches, so the
        # device works meanwhile).
        each = 0.0
        if not job.master_weights:
            tensors = len(parameter_tensors(job.model.layers, job.is_trainable))
            each = optimizer_host_s(tensors, cal) / len(opt_ops)
        opt_kernels = []
        for op in opt_ops:
            kernel_host_s = host_s + op_host_extra(op, cal)
            if not job.master_weights:
                kernel_host_s = kernel_host_s + each
            opt_kernels.append(_kernel(op, cost, kernel_host_s))
        opt = tuple(opt_kernels)
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
                    n * job.model.input.loader_cpu_s, job.loader_workers, model_flops, cal,
                    sync_before_optimizer=bool(opt) and _syncs_before_step(job))
