"""One chunk of a pipeline stage (a virtual stage's layers) on a representative rank: the
ops of one microbatch through it, in issue order, and what its passes cost.

Each layer step is lowered and costed once per shape (the caller's cache), so a search that
plans thousands of jobs costs each distinct step once.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, NamedTuple

from gpusim.hardware.calibration import Calibration
from gpusim.plan.autocast import layer_precisions, runs_in_fp8
from gpusim.plan.job import TrainingJob
from gpusim.plan.lower import lower_step, microbatch_steps
from gpusim.plan.memory import activation_split
from gpusim.plan.parallel_job import ParallelJob
from gpusim.plan.pass_cost import (
    Costed,
    Queue,
    Work,
    costed_ops,
    grad_ready,
    pass_groups,
    pass_terms,
    pass_work,
)
from gpusim.workload.layers import Layer, Linear
from gpusim.workload.model import Model
from gpusim.workload.ops import Phase, memory_op


@dataclass(frozen=True)
class ChunkPlan:
    """A model chunk held by one stage: its passes and what it sends and reduces."""

    index: int  # virtual stage: chunk k of stage s is index k x PP + s
    layers: tuple[Layer, ...]
    forward: Work
    backward: Work
    activation_bytes: float  # what it sends to the next stage per microbatch
    saved_bytes: float  # activations it keeps for backward per microbatch
    working_bytes: float  # what full recompute re-creates, one block at a time
    params: int  # on this rank
    trainable_params: int  # on this rank, not frozen: what its gradients reduce
    largest_block_params: int  # what ZeRO-3 gathers at once
    model_flops: float  # forward and backward, recompute not counted
    # When each trained layer's gradient is complete in a backward pass: (kernel seconds
    # since the one before was complete, its trainable parameters on this rank, whether it
    # is the first of its block), in the order they complete. Gradient buckets wait on these.
    grad_ready: tuple[tuple[float, int, bool], ...] = ()
    # How far the host has run ahead of the device once it has dispatched the backward pass:
    # torch.optim's Python runs meanwhile, as in the one-device engine.
    backward_host_lead_s: float = 0.0


class ChunkLayout(NamedTuple):
    """Where a chunk's layers come from: ``lead`` leading layers (the embedding), ``blocks``
    body blocks of ``block`` layers each (0: blocks of different shapes), ``tail`` trailing
    layers (the head and loss)."""

    lead: int
    blocks: int
    block: int
    tail: int


def chunk_ops(stage_job: TrainingJob, signature: tuple[int, ...], shape: tuple[Any, ...],
               cal: Calibration, cache: dict[Any, Any]) -> list[Costed]:
    """The costed ops of one microbatch of a chunk, in issue order. Each layer step is
    lowered and costed once per shape (``cache``; equal layers have equal ``signature``
    numbers) and its ops named after the layer that runs it."""
    layers = stage_job.model.layers
    precision = layer_precisions(stage_job)
    device = stage_job.device
    out: list[Costed] = []
    copies_out = stage_job.fsdp and stage_job.framework.fsdp == "per_parameter"
    unit_params: dict[str, int] = defaultdict(int)
    for la in layers if copies_out else ():
        unit_params[la.block or la.name] += la.params
    gathered: dict[str, str] = {}  # pass ("forward", "backward") -> the unit gathered last
    reducing = stage_job.fsdp
    grads: dict[str, int] = defaultdict(int)  # a unit's trained parameters
    for la in layers if reducing else ():
        if stage_job.trains_weights(la):
            grads[la.block or la.name] += la.params
    last_unit, last_layer = "", ""  # whose gradients the backward pass is computing
    for i, kind in microbatch_steps(stage_job):
        layer = layers[i]
        if copies_out:
            out += _gather_copy_out(stage_job, layer, kind, unit_params, gathered, cal, cache)
        unit = layer.block or layer.name
        if reducing and kind != "forward" and unit != last_unit:
            out += _reduce_copy_in(stage_job, last_unit, last_layer, grads, cal, cache)
            last_unit = unit
        last_layer = layer.name
        prec = precision[layer.name]
        key = ("step", shape, signature[i], kind, prec, stage_job.is_trainable(layer.name),
               stage_job.quantized(layer))
        found = cache.get(key)
        if found is None:
            found = [("" if c[0] == layer.name else c[0], *c[1:])
                     for c in costed_ops(lower_step(layer, kind, stage_job, prec), device, cal)]
            cache[key] = found
        name = layer.name
        out += [(c[0] or name, *c[1:]) for c in found]
    if reducing:
        out += _reduce_copy_in(stage_job, last_unit, last_layer, grads, cal, cache)
    return out


def _reduce_copy_in(stage_job: TrainingJob, unit: str, layer: str, grads: dict[str, int],
                    cal: Calibration, cache: dict[Any, Any]) -> list[Costed]:
    """What PyTorch FSDP does to a unit's unsharded gradients, in the compute type, before
    it reduce-scatters them, once the backward pass is done with the unit. FSDP2
    (fully_shard) copies them into one reduce-scatter input in the reduce type
    (_fsdp_collectives.py, foreach_reduce: foreach_reduce_scatter_copy_in on the current
    stream; fp32 and bf16 are averaged by NCCL, no divide kernel). FSDP1's FlatParameter
    gets them from autograd as one concatenated gradient (its layers' weights are split
    views of it), which _post_backward_hook casts to the reduce type and _reduce_grad
    divides in place by the pre-divide factor before the reduce-scatter
    (_runtime_utils.py: flat_param.grad.to(handle._reduce_dtype), _div_if_needed). FSDP1
    runs the cast and the divide on its post-backward stream; they are costed as if on the
    compute stream, where they take the same memory bandwidth. Named after ``layer``, the
    unit's layer the backward pass ran last."""
    params = grads.get(unit, 0)
    if not params:
        return []
    grad, reduce = stage_job.numerics().act_bytes, stage_job.reduce_bytes
    if stage_job.framework.fsdp == "per_parameter":
        moved = grad + reduce  # the copy-in, cast on the way
    else:
        moved = 2 * grad + (grad + reduce if reduce != grad else 0) + 2 * reduce
    key = ("fsdp_reduce_copy_in", params, moved, cal.name)
    found = cache.get(key)
    if found is None:
        # bytes per element as one-byte elements read and written (half each)
        op = memory_op("fsdp_reduce_copy_in", params * moved / 2, params * moved / 2, 1.0,
                       0.0, allocates=False, phase="backward", family="copy")
        found = cache[key] = costed_ops([op], stage_job.device, cal)[0]
    return [(layer, *found[1:])]


def _gather_copy_out(stage_job: TrainingJob, layer: Layer, kind: str,
                     unit_params: dict[str, int], gathered: dict[str, str],
                     cal: Calibration, cache: dict[Any, Any]) -> list[Costed]:
    """FSDP2's copy of a unit's all-gathered weights into its parameters, before the unit's
    first layer step of a pass (forward, or backward with its recompute): each gather's
    output is read and every parameter written, in the gathered type, on the compute
    stream (foreach_all_gather_copy_out, split_with_sizes_copy). FSDP1's layers are views
    into the gathered buffer and copy nothing."""
    unit = layer.block or layer.name
    phase: Phase = "forward" if kind == "forward" else "backward"
    params = unit_params[unit]
    if gathered.get(phase) == unit or not params:
        return []
    gathered[phase] = unit
    element = stage_job.gathered_weight_bytes
    key = ("fsdp_copy_out", params, element, phase, cal.name)
    found = cache.get(key)
    if found is None:
        op = memory_op("fsdp_copy_out", params, params, element, 0.0, allocates=False,
                       phase=phase, family="copy")
        found = cache[key] = costed_ops([op], stage_job.device, cal)[0]
    return [(layer.name, *found[1:])]


def chunk_job(job: ParallelJob, index: int, layers: tuple[Layer, ...]) -> TrainingJob:
    sub = Model(f"{job.model.name}[{index}]", layers, job.model.input, job.model.family,
                job.model.tokens_per_sample)
    return job.stage_job(sub, first=index == 0)


def fp8_layers(stage_job: TrainingJob) -> frozenset[str]:
    """The linear layers that gather their input in fp8 under sequence parallelism."""
    return (frozenset(la.name for la in stage_job.model.layers
                      if isinstance(la, Linear) and runs_in_fp8(la, stage_job))
            if stage_job.numerics().matmul == "fp8" else frozenset())


def sent_bytes(job: ParallelJob, layers: tuple[Layer, ...], act: int) -> float:
    """What a chunk sends to the next stage per microbatch: its last layer's output."""
    out = float(layers[-1].out_elements * job.parallel.microbatch_size * act)
    if job.parallel.sequence_parallel:
        out /= job.parallel.tensor  # stages exchange the sequence-split hidden states
    return out


def chunk_plan(index: int, layers: tuple[Layer, ...], signature: tuple[int, ...],
                shape: tuple[Any, ...], job: ParallelJob, cal: Calibration,
                host_per_op: float, cache: dict[Any, Any]) -> ChunkPlan:
    """A chunk costed whole, layer step by layer step."""
    stage_job = chunk_job(job, index, layers)
    ops = chunk_ops(stage_job, signature, shape, cal, cache)
    by_name = {la.name: la for la in layers}
    fwd = [op for op in ops if op[2] == "forward"]
    bwd = [op for op in ops if op[2] != "forward"]
    act = stage_job.numerics().act_bytes
    queue = Queue()  # a microbatch's backward follows its forward on the same host
    fp8 = fp8_layers(stage_job)
    groups = pass_groups(job)
    forward = pass_work(pass_terms(fwd, by_name, job, cal, host_per_op, act, fp8, groups), job,
                    cal, queue)
    backward = pass_work(pass_terms(bwd, by_name, job, cal, host_per_op, act, fp8, groups), job,
                     cal, queue)
    kept, working = activation_split(stage_job)
    blocks: dict[str, int] = {}
    for la in layers:
        blocks[la.block or la.name] = blocks.get(la.block or la.name, 0) + la.params
    return ChunkPlan(index, layers, forward, backward, sent_bytes(job, layers, act), kept,
                     working, sum(la.params for la in layers), job.trainable_params(layers),
                     max(blocks.values()), forward.flops + backward.flops,
                     grad_ready(bwd, by_name, job)[0], queue.lead_s)
