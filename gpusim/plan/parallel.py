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
per shape (``gpusim.plan.chunk``), and a chunk of identical blocks is put together from the
costs of three of them (``gpusim.plan.chunk_template``). What one pass costs, term by term,
is ``gpusim.plan.pass_cost``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any

from gpusim.comm.collectives import Collective, collective_seconds
from gpusim.comm.topology import CommGroup
from gpusim.cost.kernels import host_cost, kernel_cost, optimizer_host_s
from gpusim.hardware.calibration import Calibration, calibration_for
from gpusim.plan.chunk import ChunkLayout, ChunkPlan, chunk_plan
from gpusim.plan.chunk_template import TEMPLATE_BLOCKS, assembled_chunk, chunk_template
from gpusim.plan.context_parallel import split_sequence
from gpusim.plan.expert_parallel import expert_share, fold_experts, hold_experts
from gpusim.plan.offload import offload_seconds
from gpusim.plan.optimizer_step import optimizer_ops, parameter_tensors
from gpusim.plan.parallel_job import DEDUP_DISPATCHERS, ParallelConfig, ParallelJob
from gpusim.plan.pass_cost import expert_group
from gpusim.plan.tensor_parallel import pad_vocab, shard_layer
from gpusim.workload.layers import Layer, Linear
from gpusim.workload.model import Model

# PyTorch DDP's default bucket_cap_mb: gradients are all-reduced in buckets of this size as
# the backward pass produces them.
DDP_BUCKET_BYTES = 25 * 2**20


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


def _chunk_layers(job: ParallelJob, cache: dict[Any, Any] | None = None
                  ) -> tuple[list[tuple[Layer, ...]],
                             list[tuple[list[Layer], list[list[Layer]], list[Layer]]]]:
    """The layers of every virtual stage (PP x virtual stages of them), sharded for TP, and
    each one's parts: (leading layers, body blocks, trailing layers). Each layer is sharded
    once per split of it (``cache``), whatever the pipeline."""
    p = job.parallel
    cache = {} if cache is None else cache
    key = ("sharded", p.tensor, p.expert_tensor, p.sequence_parallel, p.context, p.expert,
           p.ep_dispatcher in DEDUP_DISPATCHERS, p.moe_imbalance, p.moe_capacity, p.moe_pad,
           p.pipeline > 1)
    if key not in cache:
        lead, body, tail = job.model.partition()
        if p.pipeline > 1:
            # Megatron-LM keeps a copy of tied word embeddings on the last stage for the head.
            # (a layer tied to another of the tail, as multi-token prediction's head to the
            # output head, shares that one's weights on the same stage)
            inside = {la.name for la in tail}
            tail = [replace(la, shared=False)
                    if isinstance(la, Linear) and la.tied_to not in inside else la
                    for la in tail]

        multiple = job.whole.framework.vocab_multiple * p.tensor

        all_to_all = p.ep_dispatcher not in DEDUP_DISPATCHERS

        def shard(layers: list[Layer]) -> list[Layer]:
            return [hold_experts(split_sequence(shard_layer(
                fold_experts(pad_vocab(la, multiple), p.tensor, p.expert_tensor), p.tensor,
                p.sequence_parallel), p.context), p.expert, all_to_all, p.moe_imbalance,
                p.moe_capacity, p.moe_pad) for la in layers]

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
           ) -> tuple[list[tuple[Layer, ...]], list[tuple[int, ...]], list[ChunkLayout]]:
    """Every chunk's layers, its signature (each layer, its name taken off, as a number:
    equal layers, equal numbers, so that chunks of the same shape share one costing) and its
    layout. All come from ``cache`` when a job of the same split was planned before."""
    p = job.parallel
    key = ("split", p.tensor, p.sequence_parallel, p.context, p.expert,
           p.ep_dispatcher in DEDUP_DISPATCHERS, p.moe_imbalance, p.moe_capacity, p.moe_pad,
           p.pipeline,
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
            layouts.append(ChunkLayout(len(lead), len(blocks), size, len(tail)))
        cache[key] = (chunks, signatures, layouts)
    found: tuple[list[tuple[Layer, ...]], list[tuple[int, ...]], list[ChunkLayout]] = cache[key]
    return found


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
    # at the first that trains) and every-k and block recompute (which checkpoint some of a
    # chunk's blocks): chunks of those are costed whole.
    alike = trains_all is None and not job.checkpointing.startswith(("every-k:", "block:"))
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
                    cache[t_key] = chunk_template(index, layers, signature, layout, shape, job,
                                             cal, host_per_op, cache)
                template = cache.get(t_key)
            cache[key] = (assembled_chunk(template, index, layers, layout.blocks, job, cal)
                          if template is not None else
                          chunk_plan(index, layers, signature, shape, job, cal, host_per_op,
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
    memory = (p.tensor, p.context, p.expert, p.moe_imbalance, p.moe_capacity, p.moe_pad,
              p.microbatch_size,
              p.sequence_parallel,
              job.precision, job.master_weights, job.fsdp, job.pure_bf16, job.fp8_recipe,
              job.quantized_base, job.adapters_only, cal.name, job.whole.framework.compiled,
              job.optimizer, job.offload)
    return (memory, p.tp_overlap, p.ep_overlap, p.ep_dispatcher, job.checkpointing)


def stage_layers(chunks: tuple[ChunkPlan, ...]) -> tuple[Layer, ...]:
    return tuple(la for c in chunks for la in c.layers)


def plan_parallel(job: ParallelJob, calibration: Calibration | None = None, *,
                  cache: dict[Any, Any] | None = None) -> ParallelPlan:
    """Cost every stage's chunks once (microbatches are identical), and place the groups.

    ``cache`` shares costed chunks between jobs that differ only in DP, ZeRO or schedule
    (a search passes one dict to every job of one model and cluster).
    """
    p = job.parallel
    cal = (calibration or calibration_for(job.topology.gpu)).sustained()  # a step's rates
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
        elif kernels and not job.master_weights:  # torch.optim's step() on the host,
            # begun while the device still runs the backward the host queued ahead of it
            # (the stage's last backward is its first chunk's)
            optimizer_s = max(optimizer_s, optimizer_host_s(tensors, cal)
                              + host_per_op * kernels - chunks[0].backward_host_lead_s)
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
    inside = {la.name for la in tail}  # a head tied to another of the tail is not the embedding's
    tied = [la for la in tail if isinstance(la, Linear) and la.shared
            and la.tied_to not in inside and job.whole.trains_weights(la)]
    t = job.parallel.tensor  # the weight copy only (a tied head's bias is its own)
    params = sum(shard_layer(replace(la, shared=False), t, False).params
                 - shard_layer(la, t, False).params for la in tied)
    if cache is not None:
        cache[key] = params
    return params
