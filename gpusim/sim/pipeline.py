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
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import simpy

from gpusim.cost.kernels import copy_cost
from gpusim.errors import InvalidConfig, SimulationStalled
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
    """Per-unit bookkeeping: what waited for what, and its data-parallel collectives."""

    def __init__(self) -> None:
        self.acct: dict[str, float] = defaultdict(float)
        self.busy = 0.0
        self.end = 0.0
        # Its collectives on the wire, as (start, nominal end), in the order they started;
        # those before spans_from ended before the pass under way began, so no pass still
        # to come overlaps them.
        self.spans: list[tuple[float, float]] = []
        self.spans_from = 0
        self.outstanding = 0  # collectives its passes issued that have not finished
        self.drained: simpy.Event | None = None  # fires when they have, once awaited


class _Fifo:
    """One job at a time, in the order they come: a simpy.Resource of capacity 1 without
    the request and release events. A job is called when its turn comes and calls
    ``release()`` when it is done."""

    __slots__ = ("busy", "queue")

    def __init__(self) -> None:
        self.busy = False
        self.queue: deque[Callable[[], object]] = deque()

    def submit(self, job: Callable[[], object]) -> None:
        if self.busy:
            self.queue.append(job)
        else:
            self.busy = True
            job()

    def release(self) -> None:
        if self.queue:
            self.queue.popleft()()
        else:
            self.busy = False


class _Costs(NamedTuple):
    """A pass's time on a unit (before link sharing and compute slowdown) and its parts."""

    length: float
    tp: float  # tensor-parallel communication
    cp: float  # context-parallel
    ep: float  # expert-parallel
    host_wait: float  # the GPU waiting for the host
    recompute: float
    host_s: float  # dispatching it


Key = tuple[int, str, int, int]  # (replica, pass kind, microbatch, virtual stage)
Unit = tuple[int, int]  # (replica, stage)
Then = Callable[[], object]  # what to do when something is over

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
    memory bandwidth); None: COMM_SLOWDOWN, 0 leaves compute alone.

    Only the compute streams are SimPy processes. Transfers and collectives are chains of
    callbacks on timeouts (one per transfer while nothing else shares its link), so a step
    costs a few events per pass."""
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
    # produced[(replica, kind, micro, virtual stage)]: when the pass finished; landed: its
    # output reached the stage that needs it; awaited: what that stage waits on until then.
    # Each output has one consumer, which takes its entries: they stay few.
    produced: dict[Key, float] = {}
    landed: set[Key] = set()
    awaited: dict[Key, simpy.Event] = {}
    units = [(r, s) for r in range(replicas) for s in range(pp)]
    tasks_of = [schedule(par.schedule, s, pp, micro, v) for s in range(pp)]
    dp_streams = {u: _Fifo() for u in units}
    stats = {u: _Unit() for u in units}
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
    gates: dict[tuple[Any, ...], list[Then]] = {}  # collective -> who reached it, in order
    issued: dict[tuple[int, int, str], int] = defaultdict(int)
    p2p_s = plan.p2p_s
    grad_bytes = job.whole.grad_bytes
    tied = tied_embedding_params(job)
    weight_bytes = job.whole.weight_bytes
    gathered_bytes = job.gathered_weight_bytes
    pcie = host_link(job.topology.gpu)
    seconds_of: dict[tuple[str, str, float], float] = {}
    # Each unit's trace tracks by stream, and each stage's pass names in schedule order.
    tracks = {(r, s): {stream: f"stage {s} {stream}" if replicas == 1
                       else f"stage {s} dp {r} {stream}"
                       for stream in ("compute", "p2p", "dp comm")}
              for r, s in units} if trace else {}
    pass_names = [[f"{t.kind}{t.micro}" + (f".{t.chunk}" if v > 1 else "") for t in tasks]
                  for tasks in tasks_of] if trace else []

    def host_copy_s(n_bytes: float) -> float:
        return copy_cost(n_bytes, pcie.bandwidth, pcie.latency, plan.calibration.pcie_efficiency)

    def collective_s(collective: str, group: str, n_bytes: float) -> float:
        """The plan's time for a collective; buckets of a chunk all ask the same."""
        key = (collective, group, n_bytes)
        if key not in seconds_of:
            seconds_of[key] = plan.collective_s(collective, group, n_bytes)  # type: ignore[arg-type]
        return seconds_of[key]

    slow_compute: dict[Unit, float] = defaultdict(lambda: 1.0)
    slow_link: dict[Unit, float] = defaultdict(lambda: 1.0)
    if straggler is not None:
        at = rank_coords(straggler.rank, par.tensor, par.data, pp)
        slow_compute[(at.replica, at.stage)] = straggler.compute
        slow_link[(at.replica, at.stage)] = straggler.link

    # A collective of a stage's replicas runs at the pace of its slowest member's link.
    group_link = [max(slow_link[(q, s)] for q in range(replicas)) for s in range(pp)]

    def costs(work: Work, unit: Unit) -> _Costs:
        """A pass's time on the unit, and its parts."""
        compute, link = slow_compute[unit], slow_link[unit]
        busy = (work.compute_s * compute
                + (work.tp_comm_s + work.cp_comm_s + work.ep_comm_s) * link)
        length = max(busy + work.stall_s, work.host_s - work.host_lead_s)
        cp = work.cp_comm_s * link
        ep = work.ep_comm_s * link
        # The GPU waiting for the host (queue run dry, or a host-bound pass throughout).
        host_wait = max(0.0, length - work.compute_s * compute - work.tp_comm_s * link
                        - cp - ep)
        return _Costs(length, work.tp_comm_s * link, cp, ep, host_wait,
                      work.recompute_s * compute, work.host_s)

    def record(unit: Unit, stream: str, name: str, start: float, category: str) -> None:
        """Trace what occupied the unit's ``stream`` until now (callers skip it, and the
        name's formatting, without a trace)."""
        now = env.now
        if now > start:
            events.append(TraceEvent(tracks[unit][stream], name, start, now, category))

    def after(seconds: float, then: Then) -> None:
        def fire(_: simpy.Event) -> None:
            then()

        env.timeout(seconds).callbacks.append(fire)

    def meet(key: tuple[Any, ...], ranks: int, then: Then) -> None:
        """``then()`` for each of ``ranks`` members of collective ``key``, in the order they
        reached it, once the last has."""
        if ranks == 1:
            then()
            return
        waiting = gates.setdefault(key, [])
        waiting.append(then)
        if len(waiting) == ranks:
            del gates[key]
            for go in waiting:
                go()

    def met(key: tuple[Any, ...], ranks: int) -> simpy.Event:
        """The event that fires when ``ranks`` members have reached collective ``key``."""
        gate = env.event()
        meet(key, ranks, gate.succeed)
        return gate

    def hop_s(r: int, source: int, target: int) -> float:
        return p2p_s * max(slow_link[(r, source)], slow_link[(r, target)])

    def land(key: Key) -> None:
        """A pass's output reached the stage that consumes it."""
        waiting = awaited.pop(key, None)
        if waiting is None:
            landed.add(key)
        else:
            waiting.succeed()

    def arrival(key: Key) -> simpy.Event | None:
        """What to wait on for a pass's output; None once it is there."""
        if key in landed:
            landed.remove(key)
            return None
        awaited[key] = env.event()
        return awaited[key]

    def link(unit: Unit, kind: str, target_stage: int) -> Callable[[Key], None]:
        """How the unit sends its passes' outputs of ``kind`` to the stage that consumes
        them: one transfer at a time on the link in that direction, in the order sent."""
        r, s = unit
        if target_stage == s or p2p_s == 0.0:
            return land
        seconds = hop_s(r, s, target_stage)
        waiting: deque[Key] = deque()
        crossing: list[Any] = [None, 0.0]  # the output under way, and since when

        def cross(key: Key) -> None:
            crossing[0], crossing[1] = key, env.now
            if shared:
                nics[unit].start(seconds, crossed)
            else:
                env.timeout(seconds).callbacks.append(lambda _: crossed())

        def crossed() -> None:
            key, start = crossing
            if trace:
                record(unit, "p2p", f"send {kind}{key[2]}", start, "pipeline_comm")
            if waiting:
                cross(waiting.popleft())
            else:
                crossing[0] = None
            land(key)

        def send(key: Key) -> None:
            if crossing[0] is None:
                cross(key)
            else:
                waiting.append(key)

        return send

    def issue(unit: Unit, label: str) -> int:
        """Number the unit's collectives of one label: members match by it."""
        r, s = unit
        nth = issued[(r, s, label)]
        issued[(r, s, label)] += 1
        return nth

    def reduce(unit: Unit, collective: str, n_bytes: float, label: str, nth: int,
               then: Then, group: str = "data", input_at: float = 0.0) -> None:
        """A data-parallel collective on the unit's communication stream, ``then()`` when
        it is done; it starts when every replica of the stage has reached it, and not before
        ``input_at``, when its input is ready (it holds its place on the stream meanwhile)."""
        s = unit[1]
        seconds = collective_s(collective, group, n_bytes)
        if seconds == 0.0:
            then()
            return
        seconds *= group_link[s]
        stream = dp_streams[unit]

        def begin() -> None:
            start = env.now
            if comm_slowdown:
                stats[unit].spans.append((start, start + seconds))

            def end() -> None:
                if trace:
                    record(unit, "dp comm", label, start, "data_parallel_comm")
                stream.release()
                then()

            if shared or on_node_links:  # done when the member slowed most by its
                # NIC's or node links' other traffic is
                link = nics[unit] if shared else node_links[unit]
                link.start(seconds, lambda: meet(("data done", s, label, nth), replicas, end))
            else:
                after(seconds, end)

        def turn() -> None:
            if input_at > env.now:
                after(input_at - env.now, lambda: meet(("data", s, label, nth), replicas, begin))
            else:
                meet(("data", s, label, nth), replicas, begin)

        stream.submit(turn)

    def reduced(unit: Unit, collective: str, n_bytes: float, label: str,
                group: str = "data") -> simpy.Event:
        """A collective issued now; the event fires when it is done."""
        done = env.event()
        reduce(unit, collective, n_bytes, label, issue(unit, label), done.succeed, group)
        return done

    def settle(info: _Unit) -> None:
        info.outstanding -= 1
        if info.outstanding == 0 and info.drained is not None:
            info.drained.succeed()

    def overlapped(unit: Unit, collective: str, n_bytes: float, label: str,
                   ready_at: float = 0.0, group: str = "data") -> None:
        """A collective issued now that the unit's optimizer step waits for; it takes its
        turn on the stream once ready at ``ready_at``."""
        info = stats[unit]
        info.outstanding += 1
        nth = issue(unit, label)

        def go() -> None:
            reduce(unit, collective, n_bytes, label, nth, lambda: settle(info), group)

        if ready_at > env.now:
            after(ready_at - env.now, go)
        else:
            go()

    def bucketed(unit: Unit, chunk: ChunkPlan, collective: str, start: float,
                 length: float) -> None:
        """Gradient buckets become ready evenly through a backward pass of ``length``."""
        total = chunk.trainable_params * grad_bytes
        if total == 0 or par.data == 1:
            return
        count = max(1, math.ceil(total / DDP_BUCKET_BYTES))
        group = "shard" if par.zero >= 2 else "data"
        for i in range(count):
            overlapped(unit, collective, total / count, f"{collective} bucket {i}",
                       start + length * (i + 1) / count, group)
        if par.shard_ranks < par.data:  # hybrid sharding: each shard all-reduced across groups
            for i in range(count):
                overlapped(unit, "all_reduce", total / count / par.shard_ranks,
                           f"all_reduce shard bucket {i}", start + length * (i + 1) / count,
                           "replicate")

    def gather(unit: Unit, params: float) -> simpy.Event:
        """ZeRO-3's all-gather of ``params`` weights; the event fires when they are here."""
        done = env.event()
        # FSDP CPU offload: the rank's fp32 shard comes up over PCIe before each gather. The
        # gather is issued now, in program order, and waits on the stream for its copy:
        # ordered by when copies finish, a slow rank's gathers and gradient buckets would
        # reach the stream in another order than the others' and the collectives would
        # never meet.
        input_at = (env.now + host_copy_s(params / par.shard_ranks * weight_bytes)
                    if job.offload == "params" else 0.0)
        label = "all_gather weights"
        reduce(unit, "all_gather", params * gathered_bytes, label, issue(unit, label),
               done.succeed, "shard", input_at)
        return done

    def overlap_s(info: _Unit, start: float) -> float:
        """Seconds since ``start`` that the unit's collectives were on the wire."""
        spans, first = info.spans, info.spans_from
        while first < len(spans) and spans[first][1] <= start:
            first += 1  # over before this pass began: no later pass overlaps it either
        info.spans_from = first
        now = env.now
        return sum(max(0.0, min(spans[i][1], now) - max(spans[i][0], start))
                   for i in range(first, len(spans)))

    def run_stage(unit: Unit, st: StagePlan) -> Any:
        r, s = unit
        info = stats[unit]
        acct = info.acct
        tasks = tasks_of[s]
        last_backward = {c: max(t.micro for t in tasks if t.kind == "B" and t.chunk == c)
                         for c in range(v)}
        # Every pass of a chunk and kind costs the same: (chunk, kind) -> its costs.
        pass_costs: dict[tuple[int, str], _Costs] = {}
        # (stage the input comes from) -> its hop; a stage's own input needs none.
        hops = {source: hop_s(r, source, s) if source != s else 0.0 for source in range(pp)}
        if par.zero == 3:  # the first block's weights before anything can run
            first = env.now
            yield gather(unit, st.chunks[tasks[0].chunk].largest_block_params)
            acct["data_parallel_comm"] += env.now - first
        send_forward = link(unit, "F", (s + 1) % pp)
        send_backward = link(unit, "B", (s - 1) % pp)
        prev_end = env.now
        for i, t in enumerate(tasks):
            chunk = st.chunks[t.chunk]
            forward = t.kind == "F"
            vs = chunk.index
            key = (r, t.kind, t.micro, vs)
            dep: Key | None
            if forward:
                dep = (r, "F", t.micro, vs - 1) if vs > 0 else None
            else:
                dep = (r, "B", t.micro, vs + 1) if vs < last_virtual else (r, "F", t.micro, vs)
            # The last virtual stage's backward pass follows its own forward pass, which
            # this stage ran before it: it waits only for outputs from other passes.
            if dep is not None and dep[3] != vs:
                waiting = arrival(dep)
                if waiting is not None:
                    yield waiting
            start = env.now
            # Split the wait before this pass: the producer still computing is pipeline
            # bubble, its output in flight is pipeline communication, the rest is waiting for
            # ZeRO-3's weight gather.
            producer = produced.pop(dep, 0.0) if dep is not None else 0.0
            hop = hops[dep[3] % pp] if dep is not None else 0.0
            arrival_s = min(start, producer + hop)
            bubble = max(0.0, min(start, producer) - prev_end)
            p2p = max(0.0, arrival_s - max(prev_end, producer))
            rest = max(0.0, start - prev_end - bubble - p2p)  # link queue, or ZeRO-3 gather
            acct["pipeline_bubble"] += bubble
            acct["pipeline_comm"] += p2p + (0.0 if par.zero == 3 else rest)
            acct["data_parallel_comm"] += rest if par.zero == 3 else 0.0
            gathering = gather(unit, chunk.params) if par.zero == 3 else None
            if (t.chunk, t.kind) not in pass_costs:
                pass_costs[(t.chunk, t.kind)] = costs(chunk.forward if forward
                                                      else chunk.backward, unit)
            length, tp, cp, ep, host_wait, recompute, host_s = pass_costs[(t.chunk, t.kind)]
            # The pass's tensor-parallel traffic, taken as one transfer after its kernels,
            # shares the node links with data-parallel collectives under way.
            tp_apart = on_node_links and tp > 0.0 and length > host_s
            kernels = env.timeout(length - tp if tp_apart else length)
            # Gradient buckets fill as the pass runs. (Their readiness is scheduled after the
            # pass's kernels: at a tie, the pass ends first.)
            if not forward and par.data > 1:
                if par.zero >= 2:
                    bucketed(unit, chunk, "reduce_scatter", start, length)
                elif par.overlap_grad_reduce and t.micro == last_backward[t.chunk]:
                    collective = "reduce_scatter" if par.zero == 1 else "all_reduce"
                    bucketed(unit, chunk, collective, start, length)
            yield kernels
            if tp_apart:
                yield from node_links[unit].transfer(tp)
                shared_tp = env.now - start - length + tp
            else:
                shared_tp = tp
            length += shared_tp - tp
            extra = 0.0
            if comm_slowdown:
                # Kernels that shared the GPU with a collective ran slower by that overlap.
                if len(info.spans) > info.spans_from:
                    extra = comm_slowdown * overlap_s(info, start)
                if extra or par.zero == 3:
                    # (Under ZeRO-3 even no slowdown takes its turn, so a bucket ready as the
                    # pass ends queues before the next pass's weight gather, as it always did.)
                    yield env.timeout(extra)
            if gathering is not None and not gathering.processed:
                waited = env.now
                yield gathering
                acct["data_parallel_comm"] += env.now - waited
            info.busy += length + extra
            acct["comm_slowdown"] += extra
            tp = shared_tp
            acct["host_dispatch"] += host_wait
            if forward:
                acct["forward"] += length - tp - cp - ep - host_wait
            else:
                acct["recompute"] += recompute
                acct["backward"] += length - tp - cp - ep - recompute - host_wait
            acct["tensor_parallel_comm"] += tp
            acct["context_parallel_comm"] += cp
            acct["expert_parallel_comm"] += ep
            prev_end = produced[key] = env.now
            if trace:
                record(unit, "compute", pass_names[s][i], start,
                       "forward" if forward else "backward")
            if forward and vs < last_virtual:
                send_forward(key)
            elif not forward and vs > 0:
                send_backward(key)
        backward_end = env.now
        if par.data > 1 and par.zero <= 1 and not par.overlap_grad_reduce:
            collective = "reduce_scatter" if par.zero == 1 else "all_reduce"
            overlapped(unit, collective, st.trainable_params * grad_bytes,
                       f"{collective} gradients")
        if info.outstanding:
            info.drained = env.event()
            yield info.drained
        acct["data_parallel_comm"] += env.now - backward_end
        if tied and s in (0, pp - 1):
            # Megatron-LM then all-reduces the tied word-embedding gradients between the
            # first and last stage (its finalize step), before the optimizer.
            waited = env.now
            yield met(("embedding", r), 2)
            start = env.now
            seconds = collective_s("all_reduce", "embedding", tied * grad_bytes)
            yield env.timeout(seconds * max(slow_link[(r, 0)], slow_link[(r, pp - 1)]))
            acct["pipeline_comm"] += env.now - waited
            if trace:
                record(unit, "dp comm", "all_reduce tied embedding", start, "pipeline_comm")
        start = env.now
        optimizer_s = st.optimizer_s * slow_compute[unit]
        yield env.timeout(optimizer_s)
        acct["optimizer"] += optimizer_s
        info.busy += optimizer_s
        if trace:
            record(unit, "compute", "optimizer step", start, "optimizer")
        if par.data > 1 and par.zero in (1, 2):
            start = env.now
            yield reduced(unit, "all_gather", st.trainable_params * weight_bytes,
                          "all_gather updated weights")
            acct["data_parallel_comm"] += env.now - start
        info.end = env.now

    procs = [env.process(run_stage(u, plan.stages[u[1]])) for u in units]
    # The run allocates tens of thousands of short-lived events and callbacks, and Python's
    # cyclic collector would walk everything alive each time their count builds up; paused,
    # their cycles are freed once after it.
    collecting = gc.isenabled()
    gc.disable()
    try:
        env.run(until=simpy.AllOf(env, procs))
    except RuntimeError as exc:  # SimPy ran out of events with a rank still waiting
        stuck = sorted(f"stage {u[1]} replica {u[0]}" for u in units if not stats[u].end)
        raise SimulationStalled(
            f"the simulated step stalled at {env.now:.6g} s with {', '.join(stuck[:4])}"
            f"{' and more' if len(stuck) > 4 else ''} waiting on collectives the others "
            f"never reached; this is a simulator defect, please report the command") from exc
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
    passes = replicas * sum(len(tasks) for tasks in tasks_of)
    return PipelineResult(step, breakdown, busy, critical[1], passes, Trace(tuple(events)),
                          len(units), critical[0])
