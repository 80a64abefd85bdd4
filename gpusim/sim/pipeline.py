"""The discrete-event simulation of one parallel training step on SimPy.

One representative rank per pipeline stage (ranks of a stage behave alike whatever their
tensor or data position), or, per rank (``per_rank``), one unit per data-parallel replica and
stage, each standing for its tensor-parallel group (see ``gpusim.sim.ranks``); a
``Straggler`` makes one of them slow. Each has a compute stream, which runs the stage's forward and
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

A collective starts when every rank of its group has reached it (data-parallel replicas of
a stage; the first and last stage for tied embeddings), and runs at the pace of its slowest
link. Pipeline transfers and data-parallel collectives that both cross the network share each
GPU's NIC while they overlap (``gpusim.sim.shared_link``). Inside a node whose GPUs reach each
other through shared ports (NVSwitch, PCIe), a pass's tensor-parallel traffic and a
data-parallel collective that stays in the node share the GPU's links; the pass's traffic is
taken as one transfer after its kernels. The step ends when every stage has finished its
optimizer step, and, with data-loader workers, no sooner than they can deliver its
microbatches (steady state: they run on through every step).
Every duration comes from the plan; the engine only schedules.
"""

from __future__ import annotations

import gc
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import simpy

from gpusim.cost.kernels import copy_cost
from gpusim.errors import InvalidConfig
from gpusim.hardware.catalog import host_link
from gpusim.plan.parallel import (
    DDP_BUCKET_BYTES,
    ChunkPlan,
    ParallelPlan,
    StagePlan,
    Work,
    tied_embedding_params,
)
from gpusim.plan.schedules import schedule
from gpusim.sim.ranks import Straggler, rank_coords
from gpusim.sim.shared_link import SharedLink
from gpusim.sim.trace import Trace, TraceEvent

BREAKDOWN_KEYS = ("forward", "backward", "recompute", "tensor_parallel_comm",
                  "context_parallel_comm", "expert_parallel_comm",
                  "pipeline_bubble", "pipeline_comm", "data_parallel_comm", "comm_slowdown",
                  "host_dispatch", "optimizer")


@dataclass(frozen=True)
class PipelineResult:
    step_time_s: float
    breakdown_s: dict[str, float]  # of the unit that finishes last; sums to step_time_s
    busy_fraction: float  # mean over simulated units of compute-stream busy time / step time
    critical_stage: int
    passes: int
    trace: Trace
    units: int = 1  # simulated units: stages, or replicas x stages per rank
    critical_replica: int = 0


class _Unit:
    """Per-unit bookkeeping: what waited for what."""

    def __init__(self) -> None:
        self.acct: dict[str, float] = defaultdict(float)
        self.busy = 0.0
        self.end = 0.0


Key = tuple[int, str, int, int]  # (replica, pass kind, microbatch, virtual stage)

# How much slower kernels run while a collective shares the GPU with them (NCCL's kernels
# take SMs and memory bandwidth): 18.9%, the average computational slowdown measured over
# GPT and Llama training kernels overlapped with their communication on 4 A100s, H100s,
# MI250s and MI210s (Agrawal et al., "Characterizing Compute-Communication Overlap in
# GPU-Accelerated Distributed Deep Learning", arXiv 2507.03114, abstract; maximum 40%).
COMM_SLOWDOWN = 0.189


def simulate_pipeline(plan: ParallelPlan, *, trace: bool = True, per_rank: bool = False,
                      straggler: Straggler | None = None,
                      comm_slowdown: float | None = None) -> PipelineResult:
    """Simulate one step of ``plan`` from an empty pipeline to the last optimizer step.

    ``per_rank`` simulates every data-parallel replica rather than one; a ``straggler``
    implies it. ``comm_slowdown``: the fraction by which kernels slow down while a
    data-parallel collective runs beside them on the same GPU (NCCL's kernels take SMs and
    memory bandwidth); None: COMM_SLOWDOWN, 0 leaves compute alone."""
    if comm_slowdown is None:
        comm_slowdown = COMM_SLOWDOWN
    if not 0.0 <= comm_slowdown < 1.0:
        raise InvalidConfig(f"the compute slowdown during communication is a fraction in "
                            f"[0, 1) (got {comm_slowdown})")
    job = plan.job
    par = job.parallel
    pp, v, micro = par.pipeline, par.virtual_stages, plan.microbatches
    replicas = par.data if per_rank or straggler is not None else 1
    last_virtual = pp * v - 1
    env = simpy.Environment()
    events: list[TraceEvent] = []
    # done[(replica, kind, micro, virtual stage)]: the pass finished; arrived[...]: its output
    # reached the stage that needs it. produced[...] records when it finished.
    done: dict[Key, simpy.Event] = {}
    arrived: dict[Key, simpy.Event] = {}
    produced: dict[Key, float] = {}
    units = [(r, s) for r in range(replicas) for s in range(pp)]
    links = {(r, s, d): simpy.Resource(env, 1) for r, s in units for d in ("F", "B")}
    dp_streams = {u: simpy.Resource(env, 1) for u in units}
    stats = {u: _Unit() for u in units}
    comm_spans: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    # When pipeline transfers and data-parallel collectives both leave the node, they share
    # the GPU's NIC (each GPU of a DGX-style node has its own): overlapping ones slow each
    # other. Transfers load the sender's NIC; collectives every member's.
    shared = (pp > 1 and par.data > 1 and plan.groups["pipeline"].spans_nodes
              and plan.groups["data"].spans_nodes)
    nics = {u: SharedLink(env) for u in units} if shared else {}
    # Inside a node, a GPU's tensor-parallel collectives and its data-parallel ones (when
    # the data-parallel group stays in the node) leave through the same links; those that
    # overlap, buckets reduced or ZeRO-3 weights gathered during a pass, share them.
    dp_during_passes = par.overlap_grad_reduce or par.zero >= 2
    on_node_links = (par.tensor > 1 and par.data > 1 and dp_during_passes
                     and not plan.groups["data"].spans_nodes
                     and job.topology.peers_share_links)
    node_links = {u: SharedLink(env) for u in units} if on_node_links else {}
    gates: dict[tuple[Any, ...], list[Any]] = {}  # collective -> [ranks arrived, start event]
    issued: dict[tuple[int, int, str], int] = defaultdict(int)
    p2p_s = plan.p2p_s
    grad_bytes = job.whole.grad_bytes
    tied = tied_embedding_params(job)
    weight_bytes = job.whole.weight_bytes
    gathered_bytes = job.gathered_weight_bytes
    pcie = host_link(job.topology.gpu)

    def host_copy_s(n_bytes: float) -> float:
        return copy_cost(n_bytes, pcie.bandwidth, pcie.latency, plan.calibration.pcie_efficiency)

    slow_compute: dict[tuple[int, int], float] = defaultdict(lambda: 1.0)
    slow_link: dict[tuple[int, int], float] = defaultdict(lambda: 1.0)
    if straggler is not None:
        at = rank_coords(straggler.rank, par.tensor, par.data, pp)
        slow_compute[(at.replica, at.stage)] = straggler.compute
        slow_link[(at.replica, at.stage)] = straggler.link

    # A collective of a stage's replicas runs at the pace of its slowest member's link.
    group_link = [max(slow_link[(q, s)] for q in range(replicas)) for s in range(pp)]

    def duration(work: Work, unit: tuple[int, int]) -> float:
        busy = (work.compute_s * slow_compute[unit]
                + (work.tp_comm_s + work.cp_comm_s + work.ep_comm_s) * slow_link[unit])
        return max(busy + work.stall_s, work.host_s - work.host_lead_s)

    def track(unit: tuple[int, int], stream: str) -> str:
        r, s = unit
        return f"stage {s} {stream}" if replicas == 1 else f"stage {s} dp {r} {stream}"

    def event(table: dict[Key, simpy.Event], key: Key) -> simpy.Event:
        if key not in table:
            table[key] = env.event()
        return table[key]

    def record(name_track: str, name: str, start: float, category: str) -> None:
        if trace and env.now > start:
            events.append(TraceEvent(name_track, name, start, env.now, category))

    def meet(key: tuple[Any, ...], ranks: int) -> simpy.Event:
        """The event that fires when ``ranks`` members have reached collective ``key``."""
        gate = gates.setdefault(key, [0, env.event()])
        gate[0] += 1
        if gate[0] == ranks:
            gate[1].succeed()
        return gate[1]  # type: ignore[no-any-return]

    def hop_s(r: int, source: int, target: int) -> float:
        return p2p_s * max(slow_link[(r, source)], slow_link[(r, target)])

    def send(unit: tuple[int, int], kind: str, key: Key, target_stage: int) -> Any:
        """Carry a pass's output to the stage that consumes it."""
        r, s = unit
        if target_stage == s or p2p_s == 0.0:
            event(arrived, key).succeed()
            return
        with links[(r, s, kind)].request() as req:
            yield req
            start = env.now
            if shared:
                yield from nics[unit].transfer(hop_s(r, s, target_stage))
            else:
                yield env.timeout(hop_s(r, s, target_stage))
            record(track(unit, "p2p"), f"send {kind}{key[2]}", start, "pipeline_comm")
        event(arrived, key).succeed()

    def reduce(unit: tuple[int, int], collective: str, n_bytes: float, label: str,
               ready_at: float = 0.0, group: str = "data") -> Any:
        """A data-parallel collective on the unit's communication stream; it starts when
        every replica of the stage has reached it."""
        r, s = unit
        nth = issued[(r, s, label)]
        issued[(r, s, label)] += 1
        if ready_at > env.now:
            yield env.timeout(ready_at - env.now)
        seconds = plan.collective_s(collective, group, n_bytes)  # type: ignore[arg-type]
        if seconds == 0.0:
            return
        seconds *= group_link[s]
        with dp_streams[unit].request() as req:
            yield req
            yield meet(("data", s, label, nth), replicas)
            start = env.now
            if comm_slowdown:
                comm_spans[unit].append((start, start + seconds))
            if shared or on_node_links:  # done when the member slowed most by its
                # NIC's or node links' other traffic is
                link = nics[unit] if shared else node_links[unit]
                yield from link.transfer(seconds)
                yield meet(("data done", s, label, nth), replicas)
            else:
                yield env.timeout(seconds)
            record(track(unit, "dp comm"), label, start, "data_parallel_comm")

    def bucketed(unit: tuple[int, int], chunk: ChunkPlan, collective: str, start: float,
                 length: float) -> list[simpy.Process]:
        """Gradient buckets become ready evenly through a backward pass of ``length``."""
        total = chunk.trainable_params * grad_bytes
        if total == 0 or par.data == 1:
            return []
        count = max(1, math.ceil(total / DDP_BUCKET_BYTES))
        group = "shard" if par.zero >= 2 else "data"
        out = [env.process(reduce(unit, collective, total / count,
                                  f"{collective} bucket {i}",
                                  start + length * (i + 1) / count, group))
               for i in range(count)]
        if par.shard_ranks < par.data:  # hybrid sharding: each shard all-reduced across groups
            out += [env.process(reduce(unit, "all_reduce", total / count / par.shard_ranks,
                                       f"all_reduce shard bucket {i}",
                                       start + length * (i + 1) / count, "replicate"))
                    for i in range(count)]
        return out

    def gather_weights(unit: tuple[int, int], params: float) -> simpy.Process:
        return env.process(gather(unit, params))

    def gather(unit: tuple[int, int], params: float) -> Any:
        if job.offload == "params":
            # FSDP CPU offload: the rank's fp32 shard comes up over PCIe before each gather
            yield env.timeout(host_copy_s(params / par.shard_ranks * weight_bytes))
        yield from reduce(unit, "all_gather", params * gathered_bytes, "all_gather weights",
                          group="shard")

    def run_stage(unit: tuple[int, int], st: StagePlan) -> Any:
        r, s = unit
        info = stats[unit]
        tasks = schedule(par.schedule, s, pp, micro, v)
        last_backward = {c: max(t.micro for t in tasks if t.kind == "B" and t.chunk == c)
                         for c in range(v)}
        pending: list[simpy.Process] = []
        if par.zero == 3:  # the first block's weights before anything can run
            first = env.now
            yield gather_weights(unit, st.chunks[tasks[0].chunk].largest_block_params)
            info.acct["data_parallel_comm"] += env.now - first
        prev_end = env.now
        for t in tasks:
            chunk = st.chunks[t.chunk]
            vs = chunk.index
            key = (r, t.kind, t.micro, vs)
            dep: Key | None
            if t.kind == "F":
                dep = (r, "F", t.micro, vs - 1) if vs > 0 else None
            else:
                dep = (r, "B", t.micro, vs + 1) if vs < last_virtual else (r, "F", t.micro, vs)
            if dep is not None:
                if dep[1] == "F" and dep[3] == vs:
                    yield event(done, dep)
                else:
                    yield event(arrived, dep)
            start = env.now
            # Split the wait before this pass: the producer still computing is pipeline
            # bubble, its output in flight is pipeline communication, the rest is waiting for
            # ZeRO-3's weight gather.
            producer = produced.get(dep, 0.0) if dep is not None else 0.0
            source = dep[3] % pp if dep is not None else s
            hop = hop_s(r, source, s) if source != s else 0.0
            arrival = min(start, producer + hop)
            bubble = max(0.0, min(start, producer) - prev_end)
            p2p = max(0.0, arrival - max(prev_end, producer))
            rest = max(0.0, start - prev_end - bubble - p2p)  # link queue, or ZeRO-3 gather
            info.acct["pipeline_bubble"] += bubble
            info.acct["pipeline_comm"] += p2p + (0.0 if par.zero == 3 else rest)
            info.acct["data_parallel_comm"] += rest if par.zero == 3 else 0.0
            gathering = gather_weights(unit, chunk.params) if par.zero == 3 else None
            work = chunk.forward if t.kind == "F" else chunk.backward
            length = duration(work, unit)
            # The GPU waiting for the host (queue run dry, or a host-bound pass throughout).
            cp = work.cp_comm_s * slow_link[unit]
            ep = work.ep_comm_s * slow_link[unit]
            host_wait = max(0.0, length - work.compute_s * slow_compute[unit]
                            - work.tp_comm_s * slow_link[unit] - cp - ep)
            if t.kind == "B" and par.data > 1:  # gradient buckets fill as the pass runs
                if par.zero >= 2:
                    pending += bucketed(unit, chunk, "reduce_scatter", start, length)
                elif par.overlap_grad_reduce and t.micro == last_backward[t.chunk]:
                    collective = "reduce_scatter" if par.zero == 1 else "all_reduce"
                    pending += bucketed(unit, chunk, collective, start, length)
            tp = work.tp_comm_s * slow_link[unit]
            if on_node_links and tp > 0.0 and length > work.host_s:
                # The pass's tensor-parallel traffic, taken as one transfer after its
                # kernels, shares the node links with data-parallel collectives under way.
                yield env.timeout(length - tp)
                yield from node_links[unit].transfer(tp)
                shared_tp = env.now - start - length + tp
            else:
                yield env.timeout(length)
                shared_tp = tp
            length += shared_tp - tp
            extra = 0.0
            if comm_slowdown:
                # Kernels that shared the GPU with a collective ran slower by that overlap.
                overlap = sum(max(0.0, min(b, env.now) - max(a, start))
                              for a, b in comm_spans[unit])
                extra = comm_slowdown * overlap
                yield env.timeout(extra)
            if gathering is not None and not gathering.processed:
                waited = env.now
                yield gathering
                info.acct["data_parallel_comm"] += env.now - waited
            info.busy += length + extra
            info.acct["comm_slowdown"] += extra
            tp = shared_tp
            info.acct["host_dispatch"] += host_wait
            if t.kind == "F":
                info.acct["forward"] += length - tp - cp - ep - host_wait
            else:
                recompute = work.recompute_s * slow_compute[unit]
                info.acct["recompute"] += recompute
                info.acct["backward"] += length - tp - cp - ep - recompute - host_wait
            info.acct["tensor_parallel_comm"] += tp
            info.acct["context_parallel_comm"] += cp
            info.acct["expert_parallel_comm"] += ep
            record(track(unit, "compute"),
                   f"{t.kind}{t.micro}" + (f".{t.chunk}" if v > 1 else ""),
                   start, "forward" if t.kind == "F" else "backward")
            prev_end = env.now
            produced[key] = env.now
            event(done, key).succeed()
            if t.kind == "F" and vs < last_virtual:
                env.process(send(unit, "F", key, (vs + 1) % pp))
            elif t.kind == "B" and vs > 0:
                env.process(send(unit, "B", key, (vs - 1) % pp))
        backward_end = env.now
        if par.data > 1 and par.zero <= 1 and not par.overlap_grad_reduce:
            collective = "reduce_scatter" if par.zero == 1 else "all_reduce"
            pending.append(env.process(reduce(unit, collective,
                                              st.trainable_params * grad_bytes,
                                              f"{collective} gradients")))
        yield simpy.AllOf(env, pending)
        info.acct["data_parallel_comm"] += env.now - backward_end
        if tied and s in (0, pp - 1):
            # Megatron-LM then all-reduces the tied word-embedding gradients between the
            # first and last stage (its finalize step), before the optimizer.
            waited = env.now
            yield meet(("embedding", r), 2)
            start = env.now
            seconds = plan.collective_s("all_reduce", "embedding", tied * grad_bytes)
            yield env.timeout(seconds * max(slow_link[(r, 0)], slow_link[(r, pp - 1)]))
            info.acct["pipeline_comm"] += env.now - waited
            record(track(unit, "dp comm"), "all_reduce tied embedding", start,
                   "pipeline_comm")
        start = env.now
        optimizer_s = st.optimizer_s * slow_compute[unit]
        yield env.timeout(optimizer_s)
        info.acct["optimizer"] += optimizer_s
        info.busy += optimizer_s
        record(track(unit, "compute"), "optimizer step", start, "optimizer")
        if par.data > 1 and par.zero in (1, 2):
            start = env.now
            yield env.process(reduce(unit, "all_gather", st.trainable_params * weight_bytes,
                                     "all_gather updated weights"))
            info.acct["data_parallel_comm"] += env.now - start
        info.end = env.now

    procs = [env.process(run_stage(u, plan.stages[u[1]])) for u in units]
    # The run allocates hundreds of thousands of short-lived events, and Python's cyclic
    # collector would walk everything alive each time their count builds up (a tenth of
    # the run); paused, their cycles are freed once after it.
    collecting = gc.isenabled()
    gc.disable()
    try:
        env.run(until=simpy.AllOf(env, procs))
    finally:
        if collecting:
            gc.enable()
    step = max(info.end for info in stats.values())
    critical = max(units, key=lambda u: (stats[u].end, -u[1], -u[0]))
    breakdown = {key: stats[critical].acct.get(key, 0.0) for key in BREAKDOWN_KEYS
                 if comm_slowdown or key != "comm_slowdown"}
    if job.input_interval_s:
        # Loader workers run on through every step, so in steady state a replica takes at
        # least as long as its loaders need to deliver the step's microbatches.
        loaded = micro * job.input_interval_s
        breakdown["input_pipeline"] = max(0.0, loaded - step)
        step = max(step, loaded)
    busy = sum(info.busy for info in stats.values()) / (len(units) * step) if step else 0.0
    passes = replicas * sum(len(schedule(par.schedule, s, pp, micro, v)) for s in range(pp))
    return PipelineResult(step, breakdown, busy, critical[1], passes, Trace(tuple(events)),
                          len(units), critical[0])
