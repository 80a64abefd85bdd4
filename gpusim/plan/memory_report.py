"""Does it fit, and how much room is left: a job's per-GPU peak by part, activations by layer
kind, where in the step the peak falls, and the largest microbatch that fits.

What ``gpusim memory`` prints and ``gpusim.memory_report`` returns; no step is simulated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gpusim import units
from gpusim.plan.activation_offload import offload_split
from gpusim.plan.job import TrainingJob
from gpusim.plan.lower import layer_kind
from gpusim.plan.memory import MemoryPlan, activations_by_layer, memory_plan
from gpusim.plan.parallel import plan_parallel
from gpusim.plan.parallel_job import ParallelJob
from gpusim.plan.stage_memory import stage_memory
from gpusim.workload.model import Model

Job = TrainingJob | ParallelJob
# The largest microbatch searched for: far beyond any device's memory for real models.
LARGEST_MICROBATCH = 2**20


@dataclass(frozen=True)
class MemoryReport:
    job: Job
    plan: MemoryPlan  # of the fullest pipeline stage
    stage: int
    activations_by_kind: dict[str, float]  # kept for backward, all microbatches in flight
    recompute_working_bytes: float  # one checkpointed block re-created in backward
    peak_at: str
    largest_microbatch: int  # 0: not even one sample fits
    offloaded_bytes: float = 0.0  # a microbatch's activations in host memory (offloaded)

    @property
    def device(self) -> str:
        job = self.job
        return job.topology.gpu.name if isinstance(job, ParallelJob) else job.device.name

    @property
    def microbatch(self) -> int:
        job = self.job
        return (job.parallel.microbatch_size if isinstance(job, ParallelJob)
                else job.microbatch_size)

    def to_json(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "model": self.job.model.name, "device": self.device,
            "parallel": self.job.parallel.describe() if isinstance(self.job, ParallelJob)
            else None,
            "microbatch_size": self.microbatch, "recompute": self.job.checkpointing,
            "fits": plan.fits, "tight": plan.tight, "peak_allocated_bytes": plan.peak_bytes,
            "peak_reserved_bytes": plan.reserved_bytes, "required_bytes": plan.required_bytes,
            "usable_bytes": plan.usable_bytes, "capacity_bytes": plan.capacity,
            "breakdown_bytes": plan.breakdown(),
            "activations_by_kind_bytes": self.activations_by_kind,
            "recompute_working_bytes": self.recompute_working_bytes,
            "peak_at": self.peak_at, "stage": self.stage,
            "largest_microbatch": self.largest_microbatch,
            "offloaded_activation_bytes": self.offloaded_bytes,
        }

    def summary(self) -> str:
        plan, job = self.plan, self.job
        where = (f"{job.topology.num_gpus} x {self.device} ({job.parallel.describe()})"
                 if isinstance(job, ParallelJob) else f"{self.device}, microbatch "
                 f"{self.microbatch}")
        fragments = ("a run whose tensors fragment more than most (the upper quartile of "
                     "published out-of-memory errors) would not" if plan.free_bytes >= 0 else
                     "only a run whose tensors fragment less than most (below the median of "
                     "published out-of-memory errors) would")
        verdict = (f"fits, tightly: {fragments}; PYTORCH_CUDA_ALLOC_CONF="
                   "expandable_segments:True fragments less"
                   if plan.tight else "fits" if plan.fits else "does NOT fit")
        device = job.topology.gpu if isinstance(job, ParallelJob) else job.device
        gpu = device.is_gpu
        lines = [f"{job.model.name} on {where}, recompute {job.checkpointing}: {verdict}",
                 "",
                 f"  peak allocated   {units.human_bytes(plan.peak_bytes):>12}  "
                 + ("per GPU (torch.cuda.max_memory_allocated)" if gpu else "in host memory")]
        if gpu:
            lines.append(f"  peak reserved    {units.human_bytes(plan.reserved_bytes):>12}  "
                         f"(the caching allocator's, max_memory_reserved)")
        lines += [(f"  needed           {units.human_bytes(plan.required_bytes):>12}  "
                   + ("(allocated + what the allocator strands + outside the allocator: CUDA "
                      "context, framework, NCCL)"
                      if gpu else "")).rstrip(),
                  f"  usable           {units.human_bytes(plan.usable_bytes):>12}  of "
                  f"{units.human_bytes(device.memory_bytes)}"
                  + ("  (what the driver gives a process)" if gpu else ""),
                  "", "  at the peak"]
        for key, value in plan.breakdown().items():
            if value:
                lines.append(f"    {key.replace('_', ' '):22s} {units.human_bytes(value):>12}")
        lines += ["", "  activations by layer kind"]
        for kind, value in sorted(self.activations_by_kind.items(), key=lambda kv: -kv[1]):
            lines.append(f"    {kind:22s} {units.human_bytes(value):>12}")
        if self.recompute_working_bytes:
            lines.append(f"    {'recompute working set':22s} "
                         f"{units.human_bytes(self.recompute_working_bytes):>12}")
        if self.offloaded_bytes:
            lines.append(f"    {'offloaded to the host':22s} "
                         f"{units.human_bytes(self.offloaded_bytes):>12}  (not on the GPU)")
        largest = (f"microbatch {self.largest_microbatch}" if self.largest_microbatch
                   else "none: even microbatch 1 does not fit")
        lines += ["", f"  peak at          {self.peak_at}",
                  f"  largest fitting  {largest}"]
        return "\n".join(lines)


def peak_plan(job: Job) -> MemoryPlan:
    """The memory plan of the job's fullest GPU (its fullest pipeline stage)."""
    if isinstance(job, ParallelJob):
        plan = plan_parallel(job)
        return max((stage_memory(plan, st) for st in plan.stages),
                   key=lambda m: m.required_bytes)
    return memory_plan(job)


def _with_microbatch(job: Job, m: int) -> Job:
    if isinstance(job, ParallelJob):
        p = job.parallel
        return replace(job, batch_size=m * p.data * job.microbatches,
                       parallel=replace(p, microbatch_size=m))
    return replace(job, batch_size=m, grad_accum=1)


def _fits(job: Job) -> bool:
    return peak_plan(job).fits


def largest_microbatch(job: Job, most: int = LARGEST_MICROBATCH) -> int:
    """The largest microbatch that fits (0 if 1 does not), the rest of the job unchanged:
    memory grows with the microbatch, so doubling then bisecting finds it."""
    if not _fits(_with_microbatch(job, 1)):
        return 0
    low = 1
    while low * 2 <= most and _fits(_with_microbatch(job, low * 2)):
        low *= 2
    high = min(low * 2, most + 1)  # does not fit (or is past the search's end)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if _fits(_with_microbatch(job, mid)) else (low, mid)
    return low


def memory_report(job: Job) -> MemoryReport:
    """The memory of ``job`` per GPU (its fullest stage) without simulating a step."""
    if isinstance(job, ParallelJob):
        parallel = plan_parallel(job)
        plans = [stage_memory(parallel, st) for st in parallel.stages]
        stage = max(range(len(plans)), key=lambda i: plans[i].required_bytes)
        plan = plans[stage]
        layers = tuple(la for c in parallel.stages[stage].chunks for la in c.layers)
        sub = Model(f"{job.model.name}-stage{stage}", layers, job.model.input,
                    job.model.family, job.model.tokens_per_sample)
        one = job.stage_job(sub, first=stage == 0)
    else:
        stage, plan, one = 0, memory_plan(job), job
    kept, working = activations_by_layer(one)
    kinds = {la.name: layer_kind(la) for la in one.model.layers}
    by_kind: dict[str, float] = {}
    for name, value in kept.items():
        kind = kinds.get(name, "checkpointed block input")
        by_kind[kind] = by_kind.get(kind, 0.0) + value
    # Scale one microbatch's split to what the schedule keeps in flight at the peak.
    total = sum(by_kind.values())
    scale = (plan.activations - working) / total if total else 0.0
    by_kind = {k: v * scale for k, v in by_kind.items() if v}
    offloaded = (offload_split(one, kept)[0]
                 if isinstance(one, TrainingJob) and one.offload_activations else 0.0)
    return MemoryReport(job, plan, stage, by_kind, working, _peak_at(job, plan, stage),
                        largest_microbatch(job), offloaded)


def _peak_at(job: Job, plan: MemoryPlan, stage: int) -> str:
    if plan.peak_phase == "optimizer":
        return ("the optimizer step: every gradient held and the step's temporaries, the "
                "activations already freed")
    where = "the start of the backward pass: the forward's activations held, the loss and " \
            "its gradient alive"
    if isinstance(job, ParallelJob):
        if job.parallel.pipeline > 1:
            return (f"pipeline stage {stage}, when its {job.parallel.schedule} schedule holds "
                    f"the most microbatches' activations at once")
        if job.parallel.zero == 3:
            where += ", the running and the prefetched unit gathered"
    return where
