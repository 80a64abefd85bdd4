"""The discrete-event simulation of one parallel training step on SimPy.

One representative rank per pipeline stage (ranks of a stage behave alike whatever their
tensor or data position). Each has a compute stream, which runs the stage's forward and
backward passes in the order its schedule gives, and a data-parallel communication stream.
Pipeline neighbours exchange activations (forward) and their gradients (backward) over the
pipeline group's link; one transfer at a time crosses each link in each direction, and a
pass starts when its input has arrived. Tensor-parallel collectives are inside each pass.

Data parallelism, by ZeRO stage:
- 0 and 1: gradients are reduced once per step. With ``overlap_grad_reduce`` in buckets while
  the last backward pass of each chunk runs (PyTorch DDP), otherwise after it (one buffer).
  ZeRO-1 reduce-scatters instead of all-reducing and all-gathers the updated weights after
  its 1/DP share of the optimizer step.
- 2: every backward pass reduce-scatters its gradients in buckets as it runs.
- 3 (FSDP): every pass all-gathers its chunk's weights block by block, each block's
  gather prefetched while the previous block computes: the pass lasts at least as long as
  its gathers, and the step's first block waits for its own; gradients as in 2.

The step ends when every stage has finished its optimizer step. Every duration comes from the
plan; the engine only schedules.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import simpy

from gpusim.plan.parallel import (
    DDP_BUCKET_BYTES,
    ChunkPlan,
    ParallelPlan,
    StagePlan,
    tied_embedding_params,
)
from gpusim.plan.schedules import schedule
from gpusim.sim.trace import Trace, TraceEvent

BREAKDOWN_KEYS = ("forward", "backward", "recompute", "tensor_parallel_comm",
                  "pipeline_bubble", "pipeline_comm", "data_parallel_comm", "optimizer")


@dataclass(frozen=True)
class PipelineResult:
    step_time_s: float
    breakdown_s: dict[str, float]  # of the stage that finishes last; sums to step_time_s
    busy_fraction: float  # mean over stages of compute-stream busy time / step time
    critical_stage: int
    passes: int
    trace: Trace


class _Stage:
    """Per-stage bookkeeping: what waited for what."""

    def __init__(self) -> None:
        self.acct: dict[str, float] = defaultdict(float)
        self.busy = 0.0
        self.end = 0.0


def simulate_pipeline(plan: ParallelPlan, *, trace: bool = True) -> PipelineResult:
    """Simulate one step of ``plan`` from an empty pipeline to the last optimizer step."""
    job = plan.job
    par = job.parallel
    pp, v, micro = par.pipeline, par.virtual_stages, plan.microbatches
    last_virtual = pp * v - 1
    env = simpy.Environment()
    events: list[TraceEvent] = []
    # done[(kind, micro, virtual stage)]: the pass finished; arrived[...]: its output reached
    # the stage that needs it. produced[...] records when it finished.
    done: dict[tuple[str, int, int], simpy.Event] = {}
    arrived: dict[tuple[str, int, int], simpy.Event] = {}
    produced: dict[tuple[str, int, int], float] = {}
    links = {(s, d): simpy.Resource(env, 1) for s in range(pp) for d in ("F", "B")}
    dp_streams = [simpy.Resource(env, 1) for _ in range(pp)]
    stats = [_Stage() for _ in range(pp)]
    p2p_s = plan.p2p_s
    grad_bytes = job.whole.grad_bytes
    tied = tied_embedding_params(job)
    weight_bytes = job.whole.weight_bytes

    def event(table: dict[tuple[str, int, int], simpy.Event],
              key: tuple[str, int, int]) -> simpy.Event:
        if key not in table:
            table[key] = env.event()
        return table[key]

    def record(track: str, name: str, start: float, category: str) -> None:
        if trace and env.now > start:
            events.append(TraceEvent(track, name, start, env.now, category))

    def send(stage: int, kind: str, key: tuple[str, int, int], target_stage: int) -> Any:
        """Carry a pass's output to the stage that consumes it."""
        if target_stage == stage or p2p_s == 0.0:
            event(arrived, key).succeed()
            return
        with links[(stage, kind)].request() as req:
            yield req
            start = env.now
            yield env.timeout(p2p_s)
            record(f"stage {stage} p2p", f"send {kind}{key[1]}", start, "pipeline_comm")
        event(arrived, key).succeed()

    def reduce(stage: int, collective: str, n_bytes: float, label: str,
               ready_at: float = 0.0) -> Any:
        """A data-parallel collective on the stage's communication stream."""
        if ready_at > env.now:
            yield env.timeout(ready_at - env.now)
        seconds = plan.collective_s(collective, "data", n_bytes)  # type: ignore[arg-type]
        if seconds == 0.0:
            return
        with dp_streams[stage].request() as req:
            yield req
            start = env.now
            yield env.timeout(seconds)
            record(f"stage {stage} dp comm", label, start, "data_parallel_comm")

    def bucketed(stage: int, chunk: ChunkPlan, collective: str, start: float,
                 duration: float) -> list[simpy.Process]:
        """Gradient buckets become ready evenly through a backward pass of ``duration``."""
        total = chunk.params * grad_bytes
        if total == 0 or par.data == 1:
            return []
        count = max(1, math.ceil(total / DDP_BUCKET_BYTES))
        return [env.process(reduce(stage, collective, total / count,
                                   f"{collective} bucket {i}",
                                   start + duration * (i + 1) / count))
                for i in range(count)]

    def gather_weights(stage: int, params: float) -> simpy.Process:
        return env.process(reduce(stage, "all_gather", params * weight_bytes,
                                  "all_gather weights"))

    def run_stage(st: StagePlan) -> Any:
        s = st.stage
        info = stats[s]
        tasks = schedule(par.schedule, s, pp, micro, v)
        last_backward = {c: max(t.micro for t in tasks if t.kind == "B" and t.chunk == c)
                         for c in range(v)}
        pending: list[simpy.Process] = []
        if par.zero == 3:  # the first block's weights before anything can run
            first = env.now
            yield gather_weights(s, st.chunks[tasks[0].chunk].largest_block_params)
            info.acct["data_parallel_comm"] += env.now - first
        prev_end = env.now
        for t in tasks:
            chunk = st.chunks[t.chunk]
            vs = chunk.index
            key = (t.kind, t.micro, vs)
            if t.kind == "F":
                dep = ("F", t.micro, vs - 1) if vs > 0 else None
            else:
                dep = ("B", t.micro, vs + 1) if vs < last_virtual else ("F", t.micro, vs)
            if dep is not None:
                if dep[0] == "F" and dep[2] == vs:
                    yield event(done, dep)
                else:
                    yield event(arrived, dep)
            start = env.now
            # Split the wait before this pass: the producer still computing is pipeline
            # bubble, its output in flight is pipeline communication, the rest is waiting for
            # ZeRO-3's weight gather.
            producer = produced.get(dep, 0.0) if dep is not None else 0.0
            hop = p2p_s if dep is not None and dep[2] % pp != s else 0.0
            arrival = min(start, producer + hop)
            bubble = max(0.0, min(start, producer) - prev_end)
            p2p = max(0.0, arrival - max(prev_end, producer))
            rest = max(0.0, start - prev_end - bubble - p2p)  # link queue, or ZeRO-3 gather
            info.acct["pipeline_bubble"] += bubble
            info.acct["pipeline_comm"] += p2p + (0.0 if par.zero == 3 else rest)
            info.acct["data_parallel_comm"] += rest if par.zero == 3 else 0.0
            gathering = gather_weights(s, chunk.params) if par.zero == 3 else None
            work = chunk.forward if t.kind == "F" else chunk.backward
            if t.kind == "B" and par.data > 1:  # gradient buckets fill as the pass runs
                if par.zero >= 2:
                    pending += bucketed(s, chunk, "reduce_scatter", start, work.duration_s)
                elif par.overlap_grad_reduce and t.micro == last_backward[t.chunk]:
                    collective = "reduce_scatter" if par.zero == 1 else "all_reduce"
                    pending += bucketed(s, chunk, collective, start, work.duration_s)
            yield env.timeout(work.duration_s)
            if gathering is not None and not gathering.processed:
                waited = env.now
                yield gathering
                info.acct["data_parallel_comm"] += env.now - waited
            info.busy += work.duration_s
            tp = work.tp_comm_s
            if t.kind == "F":
                info.acct["forward"] += work.duration_s - tp
            else:
                info.acct["recompute"] += work.recompute_s
                info.acct["backward"] += work.duration_s - tp - work.recompute_s
            info.acct["tensor_parallel_comm"] += tp
            record(f"stage {s} compute", f"{t.kind}{t.micro}" + (f".{t.chunk}" if v > 1 else ""),
                   start, "forward" if t.kind == "F" else "backward")
            prev_end = env.now
            produced[key] = env.now
            event(done, key).succeed()
            if t.kind == "F" and vs < last_virtual:
                env.process(send(s, "F", key, (vs + 1) % pp))
            elif t.kind == "B" and vs > 0:
                env.process(send(s, "B", key, (vs - 1) % pp))
        backward_end = env.now
        if par.data > 1 and par.zero <= 1 and not par.overlap_grad_reduce:
            collective = "reduce_scatter" if par.zero == 1 else "all_reduce"
            pending.append(env.process(reduce(s, collective, st.params * grad_bytes,
                                              f"{collective} gradients")))
        yield simpy.AllOf(env, pending)
        info.acct["data_parallel_comm"] += env.now - backward_end
        if tied and s in (0, pp - 1):
            # Megatron-LM then all-reduces the tied word-embedding gradients between the
            # first and last stage (its finalize step), before the optimizer.
            start = env.now
            yield env.timeout(plan.collective_s("all_reduce", "embedding", tied * grad_bytes))
            info.acct["pipeline_comm"] += env.now - start
            record(f"stage {s} dp comm", "all_reduce tied embedding", start,
                   "pipeline_comm")
        start = env.now
        yield env.timeout(st.optimizer_s)
        info.acct["optimizer"] += st.optimizer_s
        info.busy += st.optimizer_s
        record(f"stage {s} compute", "optimizer step", start, "optimizer")
        if par.data > 1 and par.zero in (1, 2):
            start = env.now
            yield env.process(reduce(s, "all_gather", st.params * weight_bytes,
                                     "all_gather weights"))
            info.acct["data_parallel_comm"] += env.now - start
        info.end = env.now

    procs = [env.process(run_stage(st)) for st in plan.stages]
    env.run(until=simpy.AllOf(env, procs))
    step = max(info.end for info in stats)
    critical = max(range(pp), key=lambda s: (stats[s].end, -s))
    breakdown = {key: stats[critical].acct.get(key, 0.0) for key in BREAKDOWN_KEYS}
    busy = sum(info.busy for info in stats) / (pp * step) if step else 0.0
    passes = sum(len(schedule(par.schedule, s, pp, micro, v)) for s in range(pp))
    return PipelineResult(step, breakdown, busy, critical, passes, Trace(tuple(events)))
