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
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

from gpusim import units
from gpusim.comm.collectives import Collective, collective_seconds
from gpusim.comm.topology import CommGroup
from gpusim.cost.energy import active_seconds
from gpusim.cost.kernels import host_cost, kernel_cost, op_host_extra, optimizer_host_s
from gpusim.hardware.calibration import Calibration, calibration_for
from gpusim.hardware.profile import DeviceProfile
from gpusim.plan.autocast import layer_precisions, runs_in_fp8
from gpusim.plan.context_parallel import cp_collectives, split_sequence
from gpusim.plan.expert_parallel import expert_share, fold_experts, hold_experts
from gpusim.plan.job import TrainingJob
from gpusim.plan.lower import (
    layer_kind,
    lower_step,
    microbatch_steps,
    optimizer_ops,
    parameter_tensors,
)
from gpusim.plan.memory import FRAMEWORK_RESERVED_BYTES, MemoryPlan, activation_split, memory_plan
from gpusim.plan.offload import offload_seconds
from gpusim.plan.parallel_job import ParallelConfig, ParallelJob
from gpusim.plan.schedules import peak_in_flight, schedule
from gpusim.plan.tensor_parallel import shard_layer, tp_collectives
from gpusim.stack import Stack, runs_compiled
from gpusim.workload.layers import Layer, Linear
from gpusim.workload.model import Model
from gpusim.workload.moe import ep_collectives
from gpusim.workload.ops import DTYPE_BYTES, Op

# PyTorch DDP's default bucket_cap_mb: gradients are all-reduced in buckets of this size as
# the backward pass produces them.
DDP_BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class Work:
    """One forward or backward pass of one model chunk for one microbatch, on one rank.

    ``compute_s`` is kernel time (recompute included; ``recompute_s`` is its part),
    ``tp_comm_s`` the tensor-parallel collectives on the critical path between those kernels,
    ``host_s`` the time to dispatch them; the pass lasts ``duration_s``.
    """

    compute_s: float
    recompute_s: float
    tp_comm_s: float
    host_s: float
    flops: float
    kernels: int
    active_s: float  # kernel time at the roofline limit (see cost/energy.py)
    # Context-parallel K/V gathers and gradient reduce-scatters, before and after attention.
    cp_comm_s: float = 0.0
    # Expert-parallel all-to-alls, sending tokens to their experts' ranks and back.
    ep_comm_s: float = 0.0
    # Time the device waits for the host within the pass: where the host dispatches more
    # slowly than short kernels run, the queue runs dry (as the one-device engine finds it).
    stall_s: float = 0.0
    # How far the host had run ahead into this pass while the device finished the last one.
    host_lead_s: float = 0.0

    @property
    def duration_s(self) -> float:
        # The host queues kernels ahead of the GPU; where it falls behind, the GPU waits.
        return max(self.compute_s + self.tp_comm_s + self.cp_comm_s + self.ep_comm_s
                   + self.stall_s, self.host_s - self.host_lead_s)


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


# An op as a pass's accounting sees it: (layer, name suffix, phase, seconds, active
# seconds, FLOPs, host seconds beyond the per-op dispatch).
Costed = tuple[str, str, str, float, float, float, float]


def costed_ops(ops: list[Op], device: DeviceProfile, cal: Calibration) -> list[Costed]:
    out: list[Costed] = []
    for op in ops:
        kc = kernel_cost(op, device, cal)
        out.append((op.layer, op.name.rsplit(".", 1)[-1], op.phase, kc.seconds,
                    active_seconds(kc), op.flops, op_host_extra(op, cal)))
    return out


def _work(ops: list[Costed], layers: dict[str, Layer], job: ParallelJob, cal: Calibration,
          host_per_op: float, act: int, queue: Queue | None = None,
          fp8: frozenset[str] = frozenset()) -> Work:
    """Cost a pass: kernels in order, each layer's tensor-parallel collectives after it
    (the ``fp8`` layers gather their inputs already cast: tp_collectives)."""
    n = job.parallel.microbatch_size
    tp_group = job.topology.place(job.parallel.tensor, stride=1)
    cp_group = job.topology.place(job.parallel.context, stride=job.parallel.tensor)
    ep_group = expert_group(job)
    compute = recompute = comm = cp_comm = ep_comm = flops = active = 0.0
    # Seconds of each layer's GEMMs by kind ("dgrad", "wgrad") that a collective may hide behind.
    gemm_s: dict[tuple[str, str], float] = defaultdict(float)
    passes: dict[tuple[str, str], None] = {}  # (phase, layer) in order of first kernel
    device_s = []
    for layer, suffix, phase, cost, busy, op_flops, _ in ops:
        device_s.append(cost)
        compute += cost
        active += busy
        if phase == "recompute":
            recompute += cost
        else:
            flops += op_flops
        gemm_s[(layer, suffix)] += cost
        if layer in layers:
            passes.setdefault((phase, layer))
    p = job.parallel
    for phase, name in passes:
        gathered = DTYPE_BYTES["fp8"] if name in fp8 else None  # recompute gathers again
        for collective, size, beside in tp_collectives(layers[name], phase, n, act, p.tensor,
                                                       p.sequence_parallel, p.tp_overlap,
                                                       gathered):
            seconds = collective_seconds(collective, tp_group, size)
            hidden = gemm_s.get((name, beside), 0.0) if beside else 0.0
            if p.tp_overlap and beside:
                # split into TP chunks pipelined with the product: one chunk stays exposed
                comm += max(seconds / p.tensor, seconds - hidden)
            else:
                comm += max(0.0, seconds - hidden)
        for collective, size in cp_collectives(layers[name], phase, n, act):
            cp_comm += collective_seconds(collective, cp_group, size)
        for collective, size in ep_collectives(layers[name], phase, n, act):
            ep_comm += collective_seconds(collective, ep_group, size)
    if p.ep_overlap:
        # the other microbatch's compute runs while these all-to-alls are in flight; this
        # pass's compute stands for it (pipeline warm-up and cool-down have no partner)
        ep_comm = max(0.0, ep_comm - compute)
    host = _host_seconds(ops, layers, cal, host_per_op, job.whole.framework)
    queue = queue or Queue()
    lead = max(0.0, queue.done - queue.dispatched)
    return Work(compute, recompute, comm, sum(host), flops, len(ops), active, cp_comm,
                ep_comm, queue.run(host, device_s), lead)


@dataclass
class Queue:
    """The host dispatching kernels into the GPU's queue, one after another (host[i]; the
    kernel then runs device[i] once the one before it is done), as the one-device engine
    runs them. It carries over from a pass to the next, so a host that ran ahead during a
    device-bound forward has a lead when the backward starts."""

    dispatched: float = 0.0
    done: float = 0.0

    def run(self, host: list[float], device: list[float]) -> float:
        """Seconds the device idles, waiting for the host, over these kernels."""
        idle = 0.0
        for h, d in zip(host, device, strict=True):
            self.dispatched += h
            if self.dispatched > self.done:
                idle += self.dispatched - self.done
                self.done = self.dispatched
            self.done += d
        return idle


def _host_seconds(ops: list[Costed], layers: dict[str, Layer], cal: Calibration,
                  host_per_op: float, stack: Stack | None = None) -> list[float]:
    """What the host spends dispatching each op of a pass, as the single-device lowering
    charges it: the op's dispatch, and at a layer's first op its Python and autograd nodes
    (a compiled block's kernels: their launch alone), and at the pass's first backward op
    the backward() call."""
    o = cal.overhead
    seen: set[tuple[str, str]] = set()
    started = False
    out = []
    compiled = ({name for name, la in layers.items() if runs_compiled(la, stack)}
                if stack is not None and stack.compiled else set())
    launch = units.us(o.launch_us)
    calls: dict[tuple[str, str], float] = {}
    for layer, _, phase, _, _, _, extra in ops:
        if layer in compiled:
            # a compiled block: each kernel launched from its graph, no Python per op
            out.append(launch + extra)
            continue
        host = host_per_op + extra
        if (phase, layer) not in seen and layer in layers:
            seen.add((phase, layer))
            kind = (layer_kind(layers[layer]), phase)
            if kind not in calls:
                calls[kind] = units.us(o.layer_call_us(*kind))
            host += calls[kind]
        if phase == "backward" and not started:
            started = True
            host += units.us(o.backward_call_us)
        out.append(host)
    return out


def _chunk_layers(job: ParallelJob, cache: dict[Any, Any] | None = None
                  ) -> list[tuple[Layer, ...]]:
    """The layers of every virtual stage (PP x virtual stages of them), sharded for TP.
    Each layer is sharded once per split of it (``cache``), whatever the pipeline."""
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
    chunks: list[list[Layer]] = []
    for c in range(count):
        blocks = body[starts[c]:starts[c] + sizes[c]] if count > 1 else body
        chunks.append([layer for block in blocks for layer in block])
    chunks[0] = lead + chunks[0]
    chunks[-1] = chunks[-1] + tail
    return [tuple(c) for c in chunks]


def _split(job: ParallelJob, cache: dict[Any, Any]
           ) -> tuple[list[tuple[Layer, ...]], list[tuple[int, ...]]]:
    """Every chunk's layers and its signature: each layer, its name taken off, as a number
    (equal layers, equal numbers), so that chunks of the same shape share one costing. Both
    come from ``cache`` when a job of the same split was planned before."""
    p = job.parallel
    key = ("split", p.tensor, p.sequence_parallel, p.context, p.expert, p.pipeline,
           p.virtual_stages, p.stage_blocks)
    if key not in cache:
        chunks = _chunk_layers(job, cache)
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

        signatures = [tuple(number(la) for la in layers) for layers in chunks]
        cache[key] = (chunks, signatures)
    found: tuple[list[tuple[Layer, ...]], list[tuple[int, ...]]] = cache[key]
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
    for i, kind in microbatch_steps(stage_job):
        layer = layers[i]
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


def _chunk_plan(index: int, layers: tuple[Layer, ...], signature: tuple[int, ...],
                shape: tuple[Any, ...], job: ParallelJob, cal: Calibration,
                host_per_op: float, cache: dict[Any, Any]) -> ChunkPlan:
    sub = Model(f"{job.model.name}[{index}]", layers, job.model.input, job.model.family,
                job.model.tokens_per_sample)
    stage_job = job.stage_job(sub, first=index == 0)
    ops = _chunk_ops(stage_job, signature, shape, cal, cache)
    by_name = {la.name: la for la in layers}
    fwd = [op for op in ops if op[2] == "forward"]
    bwd = [op for op in ops if op[2] != "forward"]
    act = stage_job.numerics().act_bytes
    queue = Queue()  # a microbatch's backward follows its forward on the same host
    fp8 = (frozenset(la.name for la in layers if runs_in_fp8(la, stage_job))
           if stage_job.numerics().matmul == "fp8" else frozenset())
    forward = _work(fwd, by_name, job, cal, host_per_op, act, queue, fp8)
    backward = _work(bwd, by_name, job, cal, host_per_op, act, queue, fp8)
    out = float(layers[-1].out_elements * job.parallel.microbatch_size * act)
    if job.parallel.sequence_parallel:
        out /= job.parallel.tensor  # stages exchange the sequence-split hidden states
    kept, working = activation_split(stage_job)
    blocks: dict[str, int] = {}
    for la in layers:
        blocks[la.block or la.name] = blocks.get(la.block or la.name, 0) + la.params
    return ChunkPlan(index, layers, forward, backward, out, kept, working,
                     sum(la.params for la in layers), job.trainable_params(layers),
                     max(blocks.values()), forward.flops + backward.flops)


def _optimizer_costs(job: ParallelJob, layers: tuple[Layer, ...], cal: Calibration
                     ) -> tuple[float, int, int]:
    """A stage's optimizer step before ZeRO shards it: its kernels' device seconds, how many
    kernels, how many parameter tensors."""
    opt_job = job.stage_job(Model(f"{job.model.name}-stage", layers, job.model.input,
                                  job.model.family))
    opt_ops = optimizer_ops(opt_job)
    seconds = sum(kernel_cost(op, job.topology.gpu, cal).seconds for op in opt_ops)
    return seconds, len(opt_ops), len(parameter_tensors(layers, job.whole.is_trainable))


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
    layer_chunks, signatures = _split(job, cache)
    # Everything of the job that changes how a chunk's layers lower and cost (the model,
    # cluster and stack are the same for every job that shares a cache).
    shape = (p.tensor, p.context, p.expert, p.microbatch_size, p.sequence_parallel,
             p.tp_overlap, p.ep_overlap, job.precision, job.checkpointing,
             job.master_weights, job.fsdp, job.pure_bf16, job.fp8_recipe,
             job.quantized_base, job.adapters_only, cal.name, job.whole.framework.compiled)
    plans, keys = [], []
    for index, (layers, signature) in enumerate(zip(layer_chunks, signatures, strict=True)):
        # Middle chunks hold identical blocks under different names: cost one of each shape.
        trains = tuple(job.whole.trains_weights(la) for la in layers) if job.freezes else ()
        key = (shape, min(index, 1), trains, signature)
        if key not in cache:
            cache[key] = _chunk_plan(index, layers, signature, shape, job, cal, host_per_op,
                                     cache)
        plans.append(replace(cache[key], index=index, layers=layers))
        keys.append(key)
    stages = []
    for s in range(p.pipeline):
        chunks = tuple(plans[k * p.pipeline + s] for k in range(p.virtual_stages))
        stage_key = tuple(keys[k * p.pipeline + s] for k in range(p.virtual_stages))
        params = sum(c.params for c in chunks)
        layers = tuple(la for c in chunks for la in c.layers)
        if ("shard", stage_key, p) not in cache:
            cache[("shard", stage_key, p)] = zero_shard(p, layers)
        shard = cache[("shard", stage_key, p)] if p.zero >= 1 else 1.0
        if ("optimizer", stage_key) not in cache:
            cache[("optimizer", stage_key)] = _optimizer_costs(job, layers, cal)
        device_s, kernels, tensors = cache[("optimizer", stage_key)]
        optimizer_s = device_s * shard
        if kernels and job.offload != "none":  # the step on the node's CPUs
            optimizer_s = offload_seconds(
                job.trainable_params(layers) * shard, job.whole.grad_bytes,
                job.whole.numerics().act_bytes, job.topology.gpu, job.topology.system, cal,
                sharing=job.topology.gpus_per_node)
        elif kernels and not job.master_weights:  # torch.optim's step() on the host
            optimizer_s = max(optimizer_s, optimizer_host_s(tensors, cal)
                              + host_per_op * kernels)
        stages.append(StagePlan(s, chunks, optimizer_s, params, stage_key))
    groups = job.topology.parallel_groups(tensor=p.tensor, data=p.data, pipeline=p.pipeline)
    # ZeRO's gathers and reduce-scatters run inside the shard group (all of DP unless hybrid
    # sharding); hybrid sharding then all-reduces each gradient shard across the groups.
    groups["shard"] = job.topology.place(p.shard_ranks, stride=p.tensor)
    groups["context"] = job.topology.place(p.context, stride=p.tensor)
    groups["expert"] = expert_group(job)
    if p.shard_ranks < p.data:
        groups["replicate"] = job.topology.place(p.data // p.shard_ranks,
                                                 stride=p.tensor * p.shard_ranks)
    if tied_embedding_params(job):
        # The first and last stage's ranks of one tensor slice, (PP - 1) x TP x DP apart.
        groups["embedding"] = job.topology.place(2, stride=(p.pipeline - 1) * p.tensor * p.data)
    return ParallelPlan(job, tuple(stages), groups, cal, cache)


def zero_shard(p: ParallelConfig, layers: tuple[Layer, ...]) -> float:
    """The fraction of a rank's weight-sized state ZeRO leaves it: 1/shard ranks, but an
    expert's state is spread over the ranks holding the same experts only."""
    f = expert_share(layers)
    return (1 - f) / p.shard_ranks + f / p.expert_data


def expert_group(job: ParallelJob) -> CommGroup:
    """The ranks that exchange tokens: adjacent data-parallel ranks, or, when EP spans
    tensor-parallel ranks too, adjacent ranks from the innermost."""
    p = job.parallel
    stride = p.tensor if p.expert <= p.data else 1
    return job.topology.place(p.expert, stride=stride)


def tied_embedding_params(job: ParallelJob) -> int:
    """Parameters per rank of the word embedding that the first stage and the last stage's
    head share (Megatron-LM all-reduces their gradients between the two each step); 0 when
    the pipeline has one stage or the head has weights of its own."""
    if job.parallel.pipeline == 1:
        return 0
    _, _, tail = job.model.partition()
    tied = [la for la in tail if isinstance(la, Linear) and la.shared
            and job.whole.trains_weights(la)]
    return sum(shard_layer(replace(la, shared=False), job.parallel.tensor, False).params
               for la in tied)


def stage_memory(plan: ParallelPlan, stage: StagePlan) -> MemoryPlan:
    """Peak memory of a rank of ``stage``: its shard of weights, gradients and optimizer
    states (divided over data-parallel ranks by the ZeRO stage), and the activations of the
    microbatches its schedule keeps in flight at once."""
    job, p = plan.job, plan.job.parallel
    layers = tuple(la for c in stage.chunks for la in c.layers)
    sub = Model(f"{job.model.name}-stage{stage.stage}", layers, job.model.input,
                job.model.family, job.model.tokens_per_sample)
    cache = plan.cache if plan.cache is not None and stage.key is not None else {}
    found: MemoryPlan | None = cache.get(("memory", stage.key, stage.stage == 0))
    # Its activations are replaced below, from the chunks' own.
    base = found or memory_plan(job.stage_job(sub, first=stage.stage == 0), (0.0, 0.0))
    cache[("memory", stage.key, stage.stage == 0)] = base
    tasks = schedule(p.schedule, stage.stage, p.pipeline, job.microbatches, p.virtual_stages)
    shard = cache.get(("shard", stage.key, p)) or zero_shard(p, layers)  # see plan_parallel
    gathered = 0.0
    if p.zero == 3:
        # The gathered weights of the running unit and of the prefetched next one, in the
        # compute type (FSDP's mixed precision gathers 16-bit weights; 4-bit ones stay
        # packed), and in backward the running unit's unsharded gradient (of the weights
        # that train) until it is reduce-scattered.
        whole, act = job.whole, job.whole.numerics().act_bytes
        units: dict[str, float] = {}
        for la in layers:
            weight = (whole.frozen_bytes(la) if whole.quantized(la)
                      else job.gathered_weight_bytes)
            grad = act if whole.trains_weights(la) else 0.0
            key = la.block or la.name
            units[key] = units.get(key, 0.0) + la.params * (2.0 * weight + grad)
        gathered = max(units.values(), default=0.0)
    # PyTorch DDP copies each gradient into its bucket for the all-reduce (the default
    # gradient_as_bucket_view=False keeps the buckets beside the gradients for the job's
    # life); Megatron-LM's gradients live in their reduce buffer already.
    buckets = base.gradients if p.data > 1 and p.zero <= 1 and not job.master_weights else 0.0
    return replace(
        base,
        communication_buffers=buckets,
        optimizer_temporaries=base.optimizer_temporaries * (shard if p.zero >= 1 else 1.0),
        gradients_at_backward=base.gradients_at_backward or job.microbatches > 1,
        weights=base.weights * (shard if p.zero >= 3 else 1.0),
        gradients=base.gradients * (shard if p.zero >= 2 else 1.0),
        optimizer_states=base.optimizer_states * (shard if p.zero >= 1 else 1.0),
        activations=peak_in_flight(tasks, [c.saved_bytes for c in stage.chunks])
        + max(c.working_bytes for c in stage.chunks),
        recompute_working=max(c.working_bytes for c in stage.chunks),
        gathered=gathered,
        framework_reserved=FRAMEWORK_RESERVED_BYTES,
    )
