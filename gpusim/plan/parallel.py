"""Planning a parallel job (``gpusim.plan.parallel_job``): what each rank runs and what it costs.

Ranks with the same pipeline stage behave alike whatever their tensor or data position, so
the plan costs one representative rank per stage:

- tensor parallelism (Megatron-LM, ``gpusim.plan.tensor_parallel``): each layer is split as
  its ``tp`` mark says; its collectives sit on the critical path of the layer issuing them.
- pipeline parallelism: the body blocks are dealt out evenly to ``pipeline`` stages
  (``virtual_stages`` chunks each when interleaved); the embedding goes to the first stage,
  the head and loss to the last. The schedule is simulated in ``gpusim.sim.pipeline``.
- data parallelism with ZeRO stage 0-3 (3 is FSDP full sharding): what is reduced, gathered
  and sharded, and when, is described here and scheduled by the simulator.

A search plans thousands of jobs over one cache: each layer step is lowered and costed once
per shape, and a chunk of identical blocks is put together from the costs of three of them
(_template), which add up term by term in the order the whole chunk would add them, so its
totals are the same to the last bit. What one pass costs, term by term, is
``gpusim.plan.pass_cost``.
"""
from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from gpusim.comm.collectives import Collective, collective_seconds
from gpusim.comm.topology import CommGroup
from gpusim.cost.kernels import host_cost, kernel_cost, optimizer_host_s
from gpusim.hardware.calibration import Calibration, calibration_for
from gpusim.plan.autocast import layer_precisions, runs_in_fp8
from gpusim.plan.context_parallel import split_sequence
from gpusim.plan.expert_parallel import expert_share, fold_experts, hold_experts
from gpusim.plan.job import TrainingJob
from gpusim.plan.lower import lower_step, microbatch_steps
from gpusim.plan.memory import (
    activation_split,
    activations_by_layer,
)
from gpusim.plan.offload import offload_seconds
from gpusim.plan.optimizer_step import optimizer_ops, parameter_tensors
from gpusim.plan.parallel_job import ParallelConfig, ParallelJob
from gpusim.plan.pass_cost import (
    Costed,
    PassTerms,
    Queue,
    Work,
    costed_ops,
    expert_group,
    grad_ready,
    joined,
    pass_groups,
    pass_terms,
    pass_work,
)
from gpusim.plan.tensor_parallel import shard_layer
from gpusim.workload.layers import Layer, Linear
from gpusim.workload.model import Model
from gpusim.workload.ops import Phase, memory_op

# PyTorch DDP's default bucket_cap_mb: gradients are all-reduced in buckets of this size as
# the backward pass produces them.
DDP_BUCKET_BYTES = 25 * 2**20


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


@dataclass(frozen=True)
class StagePlan:
    """A representative rank of one pipeline stage."""

    stage: int
    chunks: tuple[ChunkPlan, ...]
    optimizer_s: float
    params: int
    key: Any = None  # its chunks' costing keys: stages of equal keys plan alike

    @property
    def trainable_params(self) -> int:
        return sum(c.trainable_params for c in self.chunks)


@dataclass(frozen=True)
class ParallelPlan:
    job: ParallelJob
    stages: tuple[StagePlan, ...]
    groups: dict[str, CommGroup]
    calibration: Calibration
    cache: dict[Any, Any] | None = None  # shared with other jobs of a search (plan_parallel)

    @property
    def microbatches(self) -> int:
        return self.job.microbatches

    def collective_s(self, collective: Collective, group: str, n_bytes: float) -> float:
        return collective_seconds(collective, self.groups[group], n_bytes)

    @property
    def active_s_per_step(self) -> float:
        """Mean over stages of device seconds per step at the roofline limit (what draws
        power above idle); the optimizer is counted whole."""
        per_stage = [self.microbatches * sum(c.forward.active_s + c.backward.active_s
                                             for c in st.chunks) + st.optimizer_s
                     for st in self.stages]
        return sum(per_stage) / len(per_stage)

    @property
    def p2p_s(self) -> float:
        """Seconds to send one microbatch's activations to the next stage."""
        if self.job.parallel.pipeline == 1:
            return 0.0
        return collective_seconds("send_recv", self.groups["pipeline"],
                                  self.stages[0].chunks[0].activation_bytes)


class _Layout(NamedTuple):
    """Where a chunk's layers come from: ``lead`` leading layers (the embedding), ``blocks``
    body blocks of ``block`` layers each (0: blocks of different shapes), ``tail`` trailing
    layers (the head and loss)."""

    lead: int
    blocks: int
    block: int
    tail: int


def _chunk_layers(job: ParallelJob, cache: dict[Any, Any] | None = None
                  ) -> tuple[list[tuple[Layer, ...]],
                             list[tuple[list[Layer], list[list[Layer]], list[Layer]]]]:
    """The layers of every virtual stage (PP x virtual stages of them), sharded for TP, and
    each one's parts: (leading layers, body blocks, trailing layers). Each layer is sharded
    once per split of it (``cache``), whatever the pipeline."""
    p = job.parallel
    cache = {} if cache is None else cache
    key = ("sharded", p.tensor, p.expert_tensor, p.sequence_parallel, p.context, p.expert,
           p.pipeline > 1)
    if key not in cache:
        lead, body, tail = job.model.partition()
        if p.pipeline > 1:
            # Megatron-LM keeps a copy of tied word embeddings on the last stage for the head.
            tail = [replace(la, shared=False) if isinstance(la, Linear) else la for la in tail]

        def shard(layers: list[Layer]) -> list[Layer]:
            return [hold_experts(split_sequence(shard_layer(
                fold_experts(la, p.tensor, p.expert_tensor), p.tensor, p.sequence_parallel),
                p.context), p.expert) for la in layers]

        cache[key] = (shard(lead), [shard(block) for block in body], shard(tail))
    lead, body, tail = cache[key]
    count = p.pipeline * p.virtual_stages
    per = len(body) // count if count > 1 else len(body)
    sizes = list(p.stage_blocks) or [per] * count
    starts = [sum(sizes[:c]) for c in range(count)]
    parts: list[tuple[list[Layer], list[list[Layer]], list[Layer]]] = []
    chunks: list[tuple[Layer, ...]] = []
    for c in range(count):
        blocks = body[starts[c]:starts[c] + sizes[c]] if count > 1 else body
        first, last = lead if c == 0 else [], tail if c == count - 1 else []
        parts.append((first, blocks, last))
        chunks.append(tuple(first + [layer for block in blocks for layer in block] + last))
    return chunks, parts


def _split(job: ParallelJob, cache: dict[Any, Any]
           ) -> tuple[list[tuple[Layer, ...]], list[tuple[int, ...]], list[_Layout]]:
    """Every chunk's layers, its signature (each layer, its name taken off, as a number:
    equal layers, equal numbers, so that chunks of the same shape share one costing) and its
    layout. All come from ``cache`` when a job of the same split was planned before."""
    p = job.parallel
    key = ("split", p.tensor, p.sequence_parallel, p.context, p.expert, p.pipeline,
           p.virtual_stages, p.stage_blocks)
    if key not in cache:
        chunks, parts = _chunk_layers(job, cache)
        ids: dict[Layer, int] = cache.setdefault(("layer ids",), {})
        # The sharded layers are the same objects in every split of one sharding (see
        # _chunk_layers), so each is named-off and interned once.
        by_object: dict[int, tuple[Layer, int]] = cache.setdefault(("layer id of",), {})

        def number(la: Layer) -> int:
            found = by_object.get(id(la))
            if found is None or found[0] is not la:
                found = (la, ids.setdefault(replace(la, name="", block=""), len(ids)))
                by_object[id(la)] = found
            return found[1]

        # So are the blocks: each is numbered once.
        by_block: dict[int, tuple[list[Layer], tuple[int, ...]]] = cache.setdefault(
            ("block numbers",), {})

        def numbers(layers: list[Layer]) -> tuple[int, ...]:
            if not layers:
                return ()
            found = by_block.get(id(layers))
            if found is None or found[0] is not layers:
                found = (layers, tuple(number(la) for la in layers))
                by_block[id(layers)] = found
            return found[1]

        signatures, layouts = [], []
        for lead, blocks, tail in parts:
            shapes = [numbers(block) for block in blocks]
            signatures.append(numbers(lead) + tuple(itertools.chain.from_iterable(shapes))
                              + numbers(tail))
            size = len(blocks[0]) if len(set(shapes)) == 1 else 0
            layouts.append(_Layout(len(lead), len(blocks), size, len(tail)))
        cache[key] = (chunks, signatures, layouts)
    found: tuple[list[tuple[Layer, ...]], list[tuple[int, ...]], list[_Layout]] = cache[key]
    return found


def _chunk_ops(stage_job: TrainingJob, signature: tuple[int, ...], shape: tuple[Any, ...],
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
    for i, kind in microbatch_steps(stage_job):
        layer = layers[i]
        if copies_out:
            out += _gather_copy_out(stage_job, layer, kind, unit_params, gathered, cal, cache)
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
    return out


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


def _stage_job(job: ParallelJob, index: int, layers: tuple[Layer, ...]) -> TrainingJob:
    sub = Model(f"{job.model.name}[{index}]", layers, job.model.input, job.model.family,
                job.model.tokens_per_sample)
    return job.stage_job(sub, first=index == 0)


def _fp8_layers(stage_job: TrainingJob) -> frozenset[str]:
    """The linear layers that gather their input in fp8 under sequence parallelism."""
    return (frozenset(la.name for la in stage_job.model.layers
                      if isinstance(la, Linear) and runs_in_fp8(la, stage_job))
            if stage_job.numerics().matmul == "fp8" else frozenset())


def _sent_bytes(job: ParallelJob, layers: tuple[Layer, ...], act: int) -> float:
    """What a chunk sends to the next stage per microbatch: its last layer's output."""
    out = float(layers[-1].out_elements * job.parallel.microbatch_size * act)
    if job.parallel.sequence_parallel:
        out /= job.parallel.tensor  # stages exchange the sequence-split hidden states
    return out


def _chunk_plan(index: int, layers: tuple[Layer, ...], signature: tuple[int, ...],
                shape: tuple[Any, ...], job: ParallelJob, cal: Calibration,
                host_per_op: float, cache: dict[Any, Any]) -> ChunkPlan:
    """A chunk costed whole, layer step by layer step."""
    stage_job = _stage_job(job, index, layers)
    ops = _chunk_ops(stage_job, signature, shape, cal, cache)
    by_name = {la.name: la for la in layers}
    fwd = [op for op in ops if op[2] == "forward"]
    bwd = [op for op in ops if op[2] != "forward"]
    act = stage_job.numerics().act_bytes
    queue = Queue()  # a microbatch's backward follows its forward on the same host
    fp8 = _fp8_layers(stage_job)
    groups = pass_groups(job)
    forward = pass_work(pass_terms(fwd, by_name, job, cal, host_per_op, act, fp8, groups), job,
                    cal, queue)
    backward = pass_work(pass_terms(bwd, by_name, job, cal, host_per_op, act, fp8, groups), job,
                     cal, queue)
    kept, working = activation_split(stage_job)
    blocks: dict[str, int] = {}
    for la in layers:
        blocks[la.block or la.name] = blocks.get(la.block or la.name, 0) + la.params
    return ChunkPlan(index, layers, forward, backward, _sent_bytes(job, layers, act), kept,
                     working, sum(la.params for la in layers), job.trainable_params(layers),
                     max(blocks.values()), forward.flops + backward.flops,
                     grad_ready(bwd, by_name, job)[0])


# A chunk of at least three identical blocks is assembled from a template of three of them
# (see _template), costed once and shared with chunks of other sizes; a chunk of two is
# assembled where a larger one left its template, and one of a single block costed whole.
TEMPLATE_BLOCKS = 3


@dataclass(frozen=True)
class _Part:
    """What one part of a chunk (its leading layers, a block, its trailing layers) adds to
    the chunk's plan, costed where it sits."""

    forward: PassTerms
    backward: PassTerms
    kept: tuple[float, ...]  # activations it keeps for backward, entry by entry
    params: int
    trainable_params: int
    # its gradients as ChunkPlan.grad_ready counts them, and the kernel seconds after them
    grad_ready: tuple[tuple[float, int, bool], ...]
    grad_rest: float


@dataclass(frozen=True)
class _Template:
    """A chunk's parts, costed once on the chunk's leading layers, three of its blocks and
    its trailing layers: the leading layers, the first block (whose neighbour before it
    differs), a later block (the second and third cost alike, checked), and the trailing
    layers. A chunk of any number of those blocks is these parts put together."""

    lead: _Part
    first: _Part
    block: _Part
    tail: _Part
    working_bytes: float
    largest_block_params: int
    act_bytes: int


def _template(index: int, layers: tuple[Layer, ...], signature: tuple[int, ...],
              layout: _Layout, shape: tuple[Any, ...], job: ParallelJob, cal: Calibration,
              host_per_op: float, cache: dict[Any, Any]) -> _Template | None:
    """The parts of a chunk of identical blocks (``layout``), from three of them; None where
    the parts do not come apart in order or the second and third blocks differ (the chunk
    is then costed whole)."""
    size = layout.lead + 3 * layout.block
    keep = list(range(size)) + list(range(len(layers) - layout.tail, len(layers)))
    t_layers = tuple(layers[i] for i in keep)
    t_signature = tuple(signature[i] for i in keep)
    part_of = {la.name: (0 if i < layout.lead else 4 if i >= size
                         else 1 + (i - layout.lead) // layout.block)
               for i, la in enumerate(t_layers)}
    stage_job = _stage_job(job, index, t_layers)
    ops = _chunk_ops(stage_job, t_signature, shape, cal, cache)
    by_name = {la.name: la for la in t_layers}
    act = stage_job.numerics().act_bytes
    fp8 = _fp8_layers(stage_job)
    groups = pass_groups(job)

    def runs_of(pass_ops: list[Costed], order: list[int]) -> list[list[Costed]] | None:
        """The pass's ops part by part, where they run part after part in ``order``."""
        runs: list[list[Costed]] = [[] for _ in range(5)]
        at = 0
        for op in pass_ops:
            part = part_of.get(op[0], -1)
            if part not in order[at:]:
                return None  # not one of the parts, or one that already ran
            at = order.index(part)
            runs[part].append(op)
        return runs

    def parts(runs: list[list[Costed]] | None) -> list[PassTerms] | None:
        return None if runs is None else [
            pass_terms(run, by_name, job, cal, host_per_op, act, fp8, groups) for run in runs]

    forward = parts(runs_of([op for op in ops if op[2] == "forward"], [0, 1, 2, 3, 4]))
    backward_runs = runs_of([op for op in ops if op[2] != "forward"], [4, 3, 2, 1, 0])
    backward = parts(backward_runs)
    entries, working = activations_by_layer(stage_job)
    block_part = {la.block: part_of[la.name] for la in t_layers if la.block}
    kept: list[list[float]] = [[] for _ in range(5)]
    order = []
    for name, value in entries.items():
        part = part_of.get(name, block_part.get(name.removesuffix(".input"), -1))
        order.append(part)
        if part >= 0:
            kept[part].append(value)
    if (forward is None or backward is None or -1 in order or order != sorted(order)
            or any(not isinstance(la.params, int) for la in t_layers)):
        return None
    assert backward_runs is not None
    pieces = []
    for k in range(5):
        members = [la for la in t_layers if part_of[la.name] == k]
        pieces.append(_Part(forward[k], backward[k], tuple(kept[k]),
                            sum(la.params for la in members), job.trainable_params(members),
                            *grad_ready(backward_runs[k], by_name, job)))
    if pieces[2] != pieces[3]:
        return None
    blocks: dict[str, int] = {}
    for la in t_layers:
        blocks[la.block or la.name] = blocks.get(la.block or la.name, 0) + la.params
    return _Template(pieces[0], pieces[1], pieces[2], pieces[4], working,
                     max(blocks.values()), act)


def _assembled(t: _Template, index: int, layers: tuple[Layer, ...], blocks: int,
               job: ParallelJob, cal: Calibration) -> ChunkPlan:
    """A chunk of ``blocks`` blocks (two or more) put together from its template's parts,
    term by term in the order the chunk runs them."""
    rest = blocks - 1
    queue = Queue()
    forward = pass_work(joined([t.lead.forward, t.first.forward]
                            + [t.block.forward] * rest + [t.tail.forward]), job, cal, queue)
    backward = pass_work(joined([t.tail.backward] + [t.block.backward] * rest
                             + [t.first.backward, t.lead.backward]), job, cal, queue)
    kept = sum(itertools.chain(t.lead.kept, t.first.kept,
                               itertools.chain.from_iterable([t.block.kept] * rest),
                               t.tail.kept))
    params = t.lead.params + t.first.params + rest * t.block.params + t.tail.params
    trainable = (t.lead.trainable_params + t.first.trainable_params
                 + rest * t.block.trainable_params + t.tail.trainable_params)
    # the parts' gradients in the order backward runs them, each part's kernels after its
    # last gradient added to the next part's first (parts hold different blocks)
    ready: list[tuple[float, int, bool]] = []
    carry = 0.0
    for part in [t.tail] + [t.block] * rest + [t.first, t.lead]:
        entries = list(part.grad_ready)
        if entries and carry:
            entries[0] = (carry + entries[0][0], *entries[0][1:])
        ready += entries
        carry = part.grad_rest if entries else carry + part.grad_rest
    return ChunkPlan(index, layers, forward, backward, _sent_bytes(job, layers, t.act_bytes),
                     kept, t.working_bytes, params, trainable, t.largest_block_params,
                     forward.flops + backward.flops, tuple(ready))


def _optimizer_costs(job: ParallelJob, layers: tuple[Layer, ...], cal: Calibration
                     ) -> tuple[float, int, int]:
    """A stage's optimizer step before ZeRO shards it: its kernels' device seconds, how many
    kernels, how many parameter tensors."""
    opt_job = job.stage_job(Model(f"{job.model.name}-stage", layers, job.model.input,
                                  job.model.family))
    opt_ops = optimizer_ops(opt_job)
    seconds = sum(kernel_cost(op, job.topology.gpu, cal).seconds for op in opt_ops)
    return seconds, len(opt_ops), len(parameter_tensors(layers, job.whole.is_trainable))


def _placed_chunks(job: ParallelJob, cal: Calibration, host_per_op: float,
                   cache: dict[Any, Any]) -> tuple[tuple[ChunkPlan, ...], tuple[Any, ...]]:
    """Every chunk's plan, in virtual-stage order, and its costing key. Chunks of the same
    shape are costed once (middle chunks hold identical blocks under different names)."""
    layer_chunks, signatures, layouts = _split(job, cache)
    shape = _shape(job, cal)
    trains_all = (tuple(tuple(job.whole.trains_weights(la) for la in layers)
                        for layers in layer_chunks) if job.freezes else None)
    # Blocks cost alike wherever they sit in a chunk, but for frozen layers (backward stops
    # at the first that trains) and every-k recompute (which checkpoints every k-th block of
    # a chunk): chunks of those are costed whole.
    alike = trains_all is None and not job.checkpointing.startswith("every-k:")
    plans, keys = [], []
    for index, (layers, signature, layout) in enumerate(
            zip(layer_chunks, signatures, layouts, strict=True)):
        trains = trains_all[index] if trains_all is not None else ()
        key = (shape, min(index, 1), trains, signature)
        if key not in cache:
            template = None
            if alike and layout.block and layout.blocks >= 2:
                # a template per shape of the chunk's ends and its block, whatever the count
                lead, tail = signature[:layout.lead], signature[len(signature) - layout.tail:]
                block = signature[layout.lead:layout.lead + layout.block]
                t_key = ("template", shape, min(index, 1), lead, block, tail)
                if t_key not in cache and layout.blocks >= TEMPLATE_BLOCKS:
                    cache[t_key] = _template(index, layers, signature, layout, shape, job,
                                             cal, host_per_op, cache)
                template = cache.get(t_key)
            cache[key] = (_assembled(template, index, layers, layout.blocks, job, cal)
                          if template is not None else
                          _chunk_plan(index, layers, signature, shape, job, cal, host_per_op,
                                      cache))
        c = cache[key]  # placed: its index and layers
        plans.append(replace(c, index=index, layers=layers))
        keys.append(key)
    return tuple(plans), tuple(keys)


def _shape(job: ParallelJob, cal: Calibration) -> tuple[Any, ...]:
    """Everything of the job that changes how a chunk's layers lower and cost (the model,
    cluster and stack are the same for every job that shares a cache): first what its
    memory depends on too, then the recompute mode and the overlaps, which it does not."""
    p = job.parallel
    memory = (p.tensor, p.context, p.expert, p.microbatch_size, p.sequence_parallel,
              job.precision, job.master_weights, job.fsdp, job.pure_bf16, job.fp8_recipe,
              job.quantized_base, job.adapters_only, cal.name, job.whole.framework.compiled,
              job.optimizer, job.offload)
    return (memory, p.tp_overlap, p.ep_overlap, job.checkpointing)


def stage_layers(chunks: tuple[ChunkPlan, ...]) -> tuple[Layer, ...]:
    return tuple(la for c in chunks for la in c.layers)


def plan_parallel(job: ParallelJob, calibration: Calibration | None = None, *,
                  cache: dict[Any, Any] | None = None) -> ParallelPlan:
    """Cost every stage's chunks once (microbatches are identical), and place the groups.

    ``cache`` shares costed chunks between jobs that differ only in DP, ZeRO or schedule
    (a search passes one dict to every job of one model and cluster).
    """
    p = job.parallel
    cal = calibration or calibration_for(job.topology.gpu)
    host_per_op = host_cost(job.topology.gpu, cal, autograd=True)
    cache = {} if cache is None else cache
    plans, keys = _placed_chunks(job, cal, host_per_op, cache)
    # The optimizer's kernels depend on the stage's layers and on these, not on the
    # microbatch or the recompute mode.
    optimizer_shape = (job.precision, job.master_weights, job.fsdp, job.pure_bf16,
                       job.quantized_base, job.adapters_only, job.optimizer, cal.name)
    stages = []
    for s in range(p.pipeline):
        chunks = tuple(plans[k * p.pipeline + s] for k in range(p.virtual_stages))
        stage_key = tuple(keys[k * p.pipeline + s] for k in range(p.virtual_stages))
        params = sum(c.params for c in chunks)
        shard = zero_shard_of(p, stage_key, chunks, cache) if p.zero >= 1 else 1.0
        opt_key = ("optimizer", optimizer_shape, tuple(k[2:] for k in stage_key))
        if opt_key not in cache:
            cache[opt_key] = _optimizer_costs(job, stage_layers(chunks), cal)
        device_s, kernels, tensors = cache[opt_key]
        optimizer_s = device_s * shard
        if kernels and job.offload != "none":  # the step on the node's CPUs
            optimizer_s = offload_seconds(
                job.trainable_params(stage_layers(chunks)) * shard, job.whole.grad_bytes,
                job.whole.numerics().act_bytes, job.topology.gpu, job.topology.system, cal,
                sharing=job.topology.gpus_per_node)
        elif kernels and not job.master_weights:  # torch.optim's step() on the host
            optimizer_s = max(optimizer_s, optimizer_host_s(tensors, cal)
                              + host_per_op * kernels)
        stages.append(StagePlan(s, chunks, optimizer_s, params, stage_key))
    return ParallelPlan(job, tuple(stages), _groups(job, cache), cal, cache)


def _groups(job: ParallelJob, cache: dict[Any, Any]) -> dict[str, CommGroup]:
    """The job's communication groups, placed once per layout (``cache``)."""
    p = job.parallel
    tied = tied_embedding_params(job, cache)
    key = ("groups", p.tensor, p.data, p.pipeline, p.shard_ranks, p.context, p.expert,
           bool(tied))
    if key not in cache:
        groups = job.topology.parallel_groups(tensor=p.tensor, data=p.data,
                                              pipeline=p.pipeline)
        # ZeRO's gathers and reduce-scatters run inside the shard group (all of DP unless
        # hybrid sharding); hybrid sharding then all-reduces each gradient shard across the
        # groups.
        groups["shard"] = job.topology.place(p.shard_ranks, stride=p.tensor)
        groups["context"] = job.topology.place(p.context, stride=p.tensor)
        groups["expert"] = expert_group(job)
        if p.shard_ranks < p.data:
            groups["replicate"] = job.topology.place(p.data // p.shard_ranks,
                                                     stride=p.tensor * p.shard_ranks)
        if tied:
            # The first and last stage's ranks of one tensor slice, (PP - 1) x TP x DP apart.
            groups["embedding"] = job.topology.place(
                2, stride=(p.pipeline - 1) * p.tensor * p.data)
        cache[key] = groups
    return dict(cache[key])  # a plan's own: callers may add to it


def zero_shard(p: ParallelConfig, layers: tuple[Layer, ...]) -> float:
    """The fraction of a rank's weight-sized state ZeRO leaves it: 1/shard ranks, but an
    expert's state is spread over the ranks holding the same experts only."""
    return _zero_fraction(p, expert_share(layers))


def _zero_fraction(p: ParallelConfig, experts: float) -> float:
    return (1 - experts) / p.shard_ranks + experts / p.expert_data


def zero_shard_of(p: ParallelConfig, stage_key: Any, chunks: tuple[ChunkPlan, ...],
                   cache: dict[Any, Any]) -> float:
    """zero_shard of a stage, its expert share found once per stage's layers (``cache``)."""
    key = ("expert share", tuple(k[3] for k in stage_key))
    if key not in cache:
        cache[key] = expert_share(stage_layers(chunks))
    return _zero_fraction(p, cache[key])


def tied_embedding_params(job: ParallelJob, cache: dict[Any, Any] | None = None) -> int:
    """Parameters per rank of the word embedding that the first stage and the last stage's
    head share (Megatron-LM all-reduces their gradients between the two each step); 0 when
    the pipeline has one stage or the head has weights of its own. Found once per TP size
    and set of frozen layers with a ``cache``."""
    if job.parallel.pipeline == 1:
        return 0
    key = ("tied", job.parallel.tensor, job.frozen, job.adapters_only)
    if cache is not None and key in cache:
        found: int = cache[key]
        return found
    _, _, tail = job.model.partition()
    tied = [la for la in tail if isinstance(la, Linear) and la.shared
            and job.whole.trains_weights(la)]
    t = job.parallel.tensor  # the weight copy only (a tied head's bias is its own)
    params = sum(shard_layer(replace(la, shared=False), t, False).params
                 - shard_layer(la, t, False).params for la in tied)
    if cache is not None:
        cache[key] = params
    return params
