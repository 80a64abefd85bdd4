"""Lowering: a training job becomes the ordered kernels of one step, each with its costs.

One microbatch is forward, then backward in reverse layer order (input gradient, then weight
gradient); with full activation checkpointing each block's forward runs again just before its
backward, with selective checkpointing only each attention core's. The optimizer step follows
the last microbatch. Under mixed precision, autocast casts each weight to the compute type
once per forward (unless the model keeps its weights in that type, with fp32 master copies).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
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
from gpusim.hardware.calibration import Calibration, calibration_for
from gpusim.hardware.catalog import host_link
from gpusim.hardware.profile import GPUProfile, LinkProfile
from gpusim.plan.autocast import (
    LayerPrecision,
    casts_weight,
    input_elements,
    layer_precisions,
)
from gpusim.plan.job import TrainingJob
from gpusim.plan.offload import offload_seconds
from gpusim.plan.recompute import (
    checkpointed_blocks,
    policy_saved,
    recomputed_norm,
    selective_modules,
)
from gpusim.stack import runs_compiled
from gpusim.workload.attention import Attention, CrossEntropy, Embedding
from gpusim.workload.layers import Conv2d, Elementwise, Layer, Linear
from gpusim.workload.moe import MoE
from gpusim.workload.numerics import Numerics
from gpusim.workload.ops import DTYPE_BYTES, Op, Phase, memory_op

# PyTorch's foreach optimizers handle about this many tensors per fused kernel launch.
TENSORS_PER_OPTIMIZER_KERNEL = 100

# The elementwise passes PyTorch's optimizers make over each parameter tensor, as
# torch/optim/adam.py and sgd.py write them (the single-tensor loop that CPU tensors take and
# the foreach kernels CUDA tensors take run the same passes): (op, tensors read, tensors
# written, whether the result is a new tensor). Adam's ``step += 1`` is a one-element op.
Pass = tuple[str, float, float, bool]
_ADAM: list[Pass] = [("step", 0, 0, False), ("lerp_", 2, 1, False), ("mul_", 1, 1, False),
                     ("addcmul_", 2, 1, False), ("sqrt", 1, 1, True), ("div", 1, 1, True),
                     ("add_", 1, 1, False), ("addcdiv_", 3, 1, False)]
OPTIMIZER_PASSES: dict[str, list[Pass]] = {
    "adam": _ADAM,
    "adamw": [("mul_", 1, 1, False), *_ADAM],  # decoupled weight decay first
    "sgd": [("add_", 2, 1, False)],
    "sgd-momentum": [("mul_", 1, 1, False), ("add_", 2, 1, False), ("add_", 2, 1, False)],
    # bitsandbytes' AdamW8bit: one fused kernel reads the weight, its gradient and two
    # 1-byte states, and writes the weight and the states (in fp32-element units).
    "adamw8bit": [("adam_8bit", 2.5, 1.5, False)],
    # Hugging Face's Adafactor as its Trainer builds it (transformers/optimization.py,
    # Adafactor.step; no first moment, beta1 None): the weight's RMS, the squared gradient
    # plus eps, its row and column means into the factored moments, their outer product
    # times the gradient, clipped by its own RMS, scaled by the learning rate, subtracted.
    "adafactor": [("step", 0, 0, False), ("rms", 1, 0, False), ("pow", 1, 1, True),
                  ("add", 1, 1, True), ("mean_rows", 1, 0, False), ("mean_cols", 1, 0, False),
                  ("outer", 0, 1, True), ("mul_", 2, 1, False), ("rms", 1, 0, False),
                  ("div_", 1, 1, False), ("mul_", 1, 1, False), ("neg", 1, 1, True),
                  ("add_", 2, 1, False)],
}

# Megatron-LM's mixed-precision optimizer (Float16OptimizerWithFloat16Params) around apex's
# fused multi-tensor kernels, in fp32-element units (0.5: a 16-bit tensor). fp16 gradients
# are copied into fp32 main gradients and unscaled (bf16 ones accumulate in fp32 already);
# one norm pass for gradient clipping; one fused update of the fp32 main weights and states;
# the updated weights copied back into the 16-bit model.
_FUSED_UPDATE = {"adam": ("fused_adam", 4, 3), "adamw": ("fused_adam", 4, 3),
                 "sgd": ("fused_sgd", 2, 1), "sgd-momentum": ("fused_sgd", 3, 2),
                 "adamw8bit": ("adam_8bit", 2.5, 1.5)}


def _megatron_passes(job: TrainingJob) -> tuple[list[Pass], Pass, list[Pass]]:
    """The passes before the update, the fused update, the passes after it."""
    name, reads, writes = _FUSED_UPDATE[job.optimizer]
    scaled: list[Pass] = [("copy_main_grads", 0.5, 1, True), ("unscale_", 1, 1, False)]
    return ([*(scaled if job.precision == "fp16" else []), ("grad_norm", 1, 0, False)],
            (name, reads, writes, False), [("copy_main_params", 1, 0.5, False)])


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
    fp32, low = DTYPE_BYTES["fp32"], num.act_bytes
    moved = e * (fp32 + low)
    # memory_op's FLOPs (one an element written), with the bytes and allocation its own
    return [Op(f"{layer.name}.cast_input{'_grad' if backward else ''}", "memory", 1.0 * e,
               moved, "fp32", layer.name, alloc_bytes=e * (fp32 if backward else low))]


def _forward_ops(layer: Layer, job: TrainingJob, prec: LayerPrecision,
                 phase: Phase, weight_cast: bool) -> list[Op]:
    num = prec.numerics
    ops = _input_cast(layer, job, num, backward=False) if prec.casts_input else []
    if weight_cast:
        # Read the fp32 weight, write its copy in the compute type (no FLOPs).
        ops.append(Op(f"{layer.name}.cast_weight", "memory", 0,
                      layer.params * (DTYPE_BYTES["fp32"] + num.act_bytes), "fp32", layer.name,
                      alloc_bytes=layer.params * num.act_bytes))
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
        moved = layer.params * (num.act_bytes + DTYPE_BYTES["fp32"])
        ops.append(Op(f"{layer.name}.cast_grad", "memory", 0.0, moved, "fp32", layer.name,
                      alloc_bytes=layer.params * DTYPE_BYTES["fp32"]))
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
        if "moe_act" in modules and isinstance(layer, MoE):
            steps.append((i, "recompute"))
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
    if kind == "recompute" and isinstance(layer, MoE) and selective_modules(job.checkpointing):
        # moe_act: the experts' activation alone (the only recompute of a MoE a selective
        # mode makes)
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
    into their producers, and the memory-bound kernels left run as Inductor generates
    them, at the device's achieved bandwidth (family ``compiled``; eager PyTorch's norm
    and activation kernels reach less, calibration's kernel_factors)."""
    return [replace(op, family="compiled") if op.kind == "memory" else op
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


def step_in_backward_ops(job: TrainingJob, layer: Layer) -> list[Op]:
    """The optimizer step of ``layer``'s parameters inside the backward pass: torchtune
    gives each parameter an optimizer of its own and steps it from its post-accumulate-grad
    hook (torchtune/modules/optim.py, OptimizerInBackward; torchtune/training/memory.py,
    register_optim_in_bwd_hooks), so each pass is a kernel per tensor, the same work as
    the whole step's."""
    if not (layer.params and job.is_trainable(layer.name)):
        return []
    passes = list(OPTIMIZER_PASSES[job.optimizer])
    return [op for size in layer.tensor_sizes()
            for op in pass_ops(passes, [size], job.device.is_gpu, 2 if job.pure_bf16 else 4,
                               prefix=f"{layer.name}.")]


def parameter_tensors(layers: Iterable[Layer], is_trainable: Callable[[str], bool]
                      ) -> list[int]:
    """Element counts of the parameter tensors the optimizer steps, layer by layer."""
    return [size for lay in layers if lay.params and is_trainable(lay.name)
            for size in lay.tensor_sizes()]


def optimizer_ops(job: TrainingJob) -> list[Op]:
    """The optimizer step over the trainable tensors, pass by pass: on a GPU each pass is a
    few foreach kernels over lists of tensors; on a CPU, or where the stack's optimizer
    loops over the tensors (``per_tensor``), one op per tensor. With master weights,
    Megatron-LM's optimizer and its fused kernels; a per-tensor optimizer over the fp32
    masters instead updates them tensor by tensor (apex amp O2 around a Python loop)."""
    sizes = parameter_tensors(job.model.layers, job.is_trainable)
    if not sizes:
        return []
    per_tensor = job.framework.optimizer == "per_tensor"
    gpu = job.device.is_gpu
    if job.master_weights and job.mixed_precision:
        before, update, after = _megatron_passes(job)
        if not per_tensor:
            return pass_ops([*before, update, *after], sizes, gpu)
        # the copies stay multi-tensor (apex's); the clipping norm (torch's clip_grad_norm_
        # before its foreach version, PyTorch 2.0) and the update run tensor by tensor
        copies = [p for p in before if p[0] != "grad_norm"]
        looped = [p for p in before if p[0] == "grad_norm"] + OPTIMIZER_PASSES[job.optimizer]
        return [*pass_ops(copies, sizes, gpu), *pass_ops(looped, sizes, gpu, per_tensor=True),
                *pass_ops(after, sizes, gpu)]
    passes = list(OPTIMIZER_PASSES[job.optimizer])
    if job.precision == "fp16":
        passes.insert(0, ("unscale_", 1, 1, False))  # GradScaler: unscale, check inf/nan
    return pass_ops(passes, sizes, gpu, 2 if job.pure_bf16 else 4, per_tensor=per_tensor)


def pass_ops(passes: list[Pass], sizes: list[int], gpu: bool,
             element_bytes: int = 4, per_tensor: bool = False, prefix: str = "") -> list[Op]:
    """The kernels of an optimizer's passes over parameter tensors of ``sizes``, whose
    weights, gradients and states have ``element_bytes`` each (fp32 unless pure bf16);
    ``per_tensor``: one kernel per tensor on a GPU too; ``prefix`` starts each kernel's
    name."""
    if gpu and not per_tensor:
        groups = math.ceil(len(sizes) / TENSORS_PER_OPTIMIZER_KERNEL)
        total = sum(sizes)
        chunks = [total / groups] * groups
    else:
        chunks = [float(s) for s in sizes]
    ops = []
    for name, reads, writes, allocates in passes:
        for i, elements in enumerate(chunks):
            if name == "step":
                elements, reads, writes = 1.0, 1.0, 1.0
            ops.append(memory_op(f"{prefix}optimizer.{name}.{i}", reads * elements,
                                 writes * elements, element_bytes, allocates=allocates,
                                 layer="optimizer", phase="optimizer"))
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
                  active)


def layer_kind(layer: Layer) -> str:
    """The kind of layer whose host cost calibration states (layer_us): its op for
    elementwise layers, else its class."""
    if isinstance(layer, Elementwise):
        return layer.op or "elementwise"
    if isinstance(layer, Attention):
        return "attention" if layer.fused else "attention_unfused"
    return {Linear: "linear", Conv2d: "conv", Embedding: "embedding",
            CrossEntropy: "cross_entropy"}.get(type(layer), type(layer).__name__.lower())


def lower(job: TrainingJob, calibration: Calibration | None = None) -> StepPlan:
    """The step plan of ``job``, every kernel costed for its device (under ``calibration``
    when given, else the device's own)."""
    cal = calibration or calibration_for(job.device)
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
                    n * job.model.input.loader_cpu_s, job.loader_workers, model_flops, cal)
