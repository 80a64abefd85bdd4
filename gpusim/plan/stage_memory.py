"""The peak memory of a rank of one pipeline stage of a parallel plan: its ZeRO shard of
weights, gradients and optimizer states, the activations its schedule keeps in flight, and
ZeRO-3's gathered units (``gpusim.plan.parallel`` plans the stages; a search asks this of
thousands of them over the plan's cache)."""

from __future__ import annotations

from dataclasses import replace

from gpusim.comm.nccl_memory import communicator_bytes
from gpusim.plan.memory import FRAMEWORK_RESERVED_BYTES, MemoryPlan, memory_plan
from gpusim.plan.parallel import (
    ParallelPlan,
    StagePlan,
    stage_layers,
    zero_shard,
    zero_shard_of,
)
from gpusim.plan.parallel_job import ParallelJob
from gpusim.plan.schedules import peak_in_flight, schedule
from gpusim.workload.layers import Layer
from gpusim.workload.model import Model


def stage_memory(plan: ParallelPlan, stage: StagePlan) -> MemoryPlan:
    """Peak memory of a rank of ``stage``: its shard of weights, gradients and optimizer
    states (divided over data-parallel ranks by the ZeRO stage), and the activations of the
    microbatches its schedule keeps in flight at once."""
    job, p = plan.job, plan.job.parallel
    cache = plan.cache if plan.cache is not None and stage.key is not None else {}
    shared = cache is plan.cache
    # Its activations are replaced below, from the chunks' own; the rest does not depend on
    # the recompute mode or the overlaps (the shape's first part, see _shape).
    key = ("memory", tuple((k[0][0], *k[1:]) for k in stage.key) if shared else None,
           stage.stage == 0)
    base: MemoryPlan | None = cache.get(key)
    if base is None:
        sub = Model(f"{job.model.name}-stage{stage.stage}", stage_layers(stage.chunks),
                    job.model.input, job.model.family, job.model.tokens_per_sample)
        base = memory_plan(job.stage_job(sub, first=stage.stage == 0), (0.0, 0.0))
        cache[key] = base
    saved = tuple(c.saved_bytes for c in stage.chunks)
    flight_key = ("in flight", p.schedule, stage.stage, p.pipeline, job.microbatches,
                  p.virtual_stages, saved)
    if flight_key not in cache:
        # the stage's last schedule only: the next job has the same one more often than not
        order, tasks = cache.get(("schedule", stage.stage), (None, []))
        if order != flight_key[:-1]:
            order = flight_key[:-1]
            tasks = schedule(p.schedule, stage.stage, p.pipeline, job.microbatches,
                             p.virtual_stages)
            cache[("schedule", stage.stage)] = (order, tasks)
        cache[flight_key] = peak_in_flight(tasks, list(saved))
    in_flight: float = cache[flight_key]
    shard = (zero_shard_of(p, stage.key, stage.chunks, cache) if shared
             else zero_shard(p, stage_layers(stage.chunks)))
    gathered = 0.0
    if p.zero == 3:
        gathered_key = ("gathered", stage.key if shared else None)
        if gathered_key not in cache:
            cache[gathered_key] = _gathered_bytes(job, stage_layers(stage.chunks))
        gathered = cache[gathered_key]
    # PyTorch DDP copies each gradient into its bucket for the all-reduce (the default
    # gradient_as_bucket_view=False keeps the buckets beside the gradients for the job's
    # life); Megatron-LM's gradients live in their reduce buffer already.
    buckets = base.gradients if p.data > 1 and p.zero <= 1 and not job.master_weights else 0.0
    working = max(c.working_bytes for c in stage.chunks)
    nccl_key = ("nccl", *sorted(plan.groups.items()))
    if nccl_key not in cache:
        cache[nccl_key] = sum(communicator_bytes(
            plan.groups, job.topology.gpu.architecture).values())
    return replace(
        base,
        communication_buffers=buckets,
        optimizer_temporaries=base.optimizer_temporaries * (shard if p.zero >= 1 else 1.0),
        gradients_at_backward=base.gradients_at_backward or job.microbatches > 1,
        weights=base.weights * (shard if p.zero >= 3 else 1.0),
        gradients=base.gradients * (shard if p.zero >= 2 else 1.0),
        optimizer_states=base.optimizer_states * (shard if p.zero >= 1 else 1.0),
        activations=in_flight + working,
        recompute_working=working,
        gathered=gathered,
        framework_reserved=FRAMEWORK_RESERVED_BYTES,
        nccl_communicators=cache[nccl_key],
    )


def _gathered_bytes(job: ParallelJob, layers: tuple[Layer, ...]) -> float:
    """ZeRO-3's gathered weights of the running unit and of the prefetched next one, in the
    compute type (FSDP's mixed precision gathers 16-bit weights; 4-bit ones stay packed),
    and in backward the running unit's unsharded gradient (of the weights that train) until
    it is reduce-scattered."""
    whole, act = job.whole, job.whole.numerics().act_bytes
    per_unit: dict[str, float] = {}
    for la in layers:
        weight = whole.frozen_bytes(la) if whole.quantized(la) else job.gathered_weight_bytes
        grad = act if whole.trains_weights(la) else 0.0
        key = la.block or la.name
        per_unit[key] = per_unit.get(key, 0.0) + la.params * (2.0 * weight + grad)
    return max(per_unit.values(), default=0.0)
