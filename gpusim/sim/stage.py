"""A unit's compute stream: its stage's forward and backward passes in schedule order, then
its optimizer step.

A pass starts when its input has arrived (the previous virtual stage's output forward, the
next one's gradient backward; a last virtual stage's backward follows its own forward). The
wait before it is split into pipeline bubble (the producer still computing), pipeline
communication (the output in flight, or queued on the link) and, under ZeRO-3, waiting for
the weight gather. Kernels run slower by ``comm_slowdown`` while a data-parallel collective
shares the GPU with them, or (--ep-overlap) the expert-parallel all-to-alls run beside them.

Everything a stage's passes have in common across its replicas (schedule, dependencies,
names, costs on an ordinary unit) is worked out once per stage in ``StageTable``; the loop
keeps the breakdown's terms in locals and hands them to the unit when its step is over.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, NamedTuple

import simpy

from gpusim.plan.parallel import StagePlan
from gpusim.plan.parallel_job import ParallelConfig
from gpusim.plan.schedules import schedule
from gpusim.sim.accounting import PassCosts, pass_costs
from gpusim.sim.calls import Gates, Wait
from gpusim.sim.collectives import DataParallel
from gpusim.sim.trace import TraceEvent, trace_event
from gpusim.sim.transfers import Outputs, pass_id
from gpusim.sim.unit import Unit

# Per pass: forward?, chunk, its number, its input's number (-1: none), whether
# the input comes from another virtual stage, that stage's pipeline stage, gradient buckets'
# collective (None: none issued), where its output goes (1: forward, -1: backward, 0: none).
Row = tuple[bool, int, int, int, bool, int, str | None, int]


class StageTable:
    """A stage's passes in schedule order, and what each needs, for all its replicas."""

    def __init__(self, par: ParallelConfig, stage: int, st: StagePlan, microbatches: int,
                 trace: bool) -> None:
        pp, v = par.pipeline, par.virtual_stages
        virtual, last = pp * v, pp * v - 1
        tasks = schedule(par.schedule, stage, pp, microbatches, v)
        self.stage, self.plan, self.first_chunk = stage, st, tasks[0].chunk
        last_backward = {c: max(t.micro for t in tasks if t.kind == "B" and t.chunk == c)
                         for c in range(v)}
        rows: list[Row] = []
        for t in tasks:
            forward = t.kind == "F"
            vs = st.chunks[t.chunk].index
            if forward:
                dep = pass_id(False, t.micro, vs - 1, virtual) if vs > 0 else -1
                dep_vs = vs - 1
            elif vs < last:
                dep, dep_vs = pass_id(True, t.micro, vs + 1, virtual), vs + 1
            else:  # the last virtual stage's backward follows its own forward
                dep, dep_vs = pass_id(False, t.micro, vs, virtual), vs
            buckets = None
            if not forward and par.data > 1:
                if par.zero >= 2:
                    buckets = "reduce_scatter"
                elif par.overlap_grad_reduce and t.micro == last_backward[t.chunk]:
                    buckets = "reduce_scatter" if par.zero == 1 else "all_reduce"
            send = (1 if forward and vs < last else -1 if not forward and vs > 0 else 0)
            rows.append((forward, t.chunk, pass_id(not forward, t.micro, vs, virtual),
                         dep, dep >= 0 and dep_vs != vs, dep_vs % pp, buckets, send))
        self.rows = rows
        self.names = ([f"{t.kind}{t.micro}" + (f".{t.chunk}" if v > 1 else "") for t in tasks]
                      if trace else [])
        self._costs: dict[tuple[float, float], list[PassCosts]] = {}

    def costs(self, compute: float, link: float) -> list[PassCosts]:
        """Each pass's costs on a unit with these slowdowns (shared by the units alike)."""
        known = self._costs.get((compute, link))
        if known is None:
            by_kind = {(c, forward): pass_costs(chunk.forward if forward else chunk.backward,
                                                compute, link)
                       for c, chunk in enumerate(self.plan.chunks) for forward in (True, False)}
            known = self._costs[(compute, link)] = [by_kind[(row[1], row[0])]
                                                    for row in self.rows]
        return known


class Shared(NamedTuple):
    """What every unit's compute stream reads from the rest of the step."""

    env: simpy.Environment
    par: ParallelConfig
    dp: DataParallel
    outputs: list[Outputs]  # by replica
    embedding: Gates  # the first and last stage's tied-embedding all-reduce, by replica
    comm_slowdown: float
    events: list[TraceEvent] | None  # the trace (None: none)
    grad_bytes: float
    weight_bytes: float
    gathered_bytes: float
    tied_params: float  # word-embedding weights tied between first and last stage
    host_copy_s: Callable[[float], float] | None  # offloaded shards' copy up, if any
    embedding_link: Callable[[int], float]  # the slowest link factor of a replica's pair


def gather(sh: Shared, unit: Unit, params: float) -> simpy.Event:
    """ZeRO-3's all-gather of ``params`` weights; the event fires when they are here."""
    env, par = sh.env, sh.par
    done = env.event()
    # FSDP CPU offload: the rank's fp32 shard comes up over PCIe before each gather. The
    # gather is issued now, in program order, and waits on the stream for its copy:
    # ordered by when copies finish, a slow rank's gathers and gradient buckets would
    # reach the stream in another order than the others' and the collectives would
    # never meet.
    input_at = (env.now + sh.host_copy_s(params / par.shard_ranks * sh.weight_bytes)
                if sh.host_copy_s is not None else 0.0)
    sh.dp.reduce(unit, "all_gather", params * sh.gathered_bytes, "all_gather weights",
                 done.succeed, "shard", input_at)
    return done


def run_stage(sh: Shared, unit: Unit, table: StageTable, hops: list[float]
              ) -> Generator[Any, Any, None]:
    """The unit's step; ``hops[s]``: seconds an output takes from stage ``s`` to it."""
    env, par, dp, st = sh.env, sh.par, sh.dp, table.plan
    s = unit.stage
    outputs = sh.outputs[unit.replica]
    produced, arrival = outputs.produced, outputs.arrival
    zero3 = par.zero == 3
    comm_slowdown, node_links, events = sh.comm_slowdown, unit.node_links, sh.events
    names, compute_track = table.names, unit.tracks[0]
    chunks = st.chunks
    # The breakdown's terms, each summed in the order the original dict summed them.
    bubble = pipeline_comm = dp_comm = slowdown = host_dispatch = 0.0
    forward_s = backward_s = recompute_s = tp_comm = cp_comm = ep_comm = busy = 0.0
    if zero3:  # the first block's weights before anything can run
        first = env.now
        yield gather(sh, unit, chunks[table.first_chunk].largest_block_params)
        dp_comm += env.now - first
    assert unit.senders is not None
    send_forward, send_backward = unit.senders
    prev_end = env.now
    for i, (forward, c, pid, dep, remote, dep_stage, buckets, send) in enumerate(table.rows):
        if remote:
            waiting = arrival(dep)
            if waiting is not None:
                yield waiting
        start = env.now
        # Split the wait before this pass: the producer still computing is pipeline
        # bubble, its output in flight is pipeline communication, the rest is waiting for
        # ZeRO-3's weight gather.
        if dep >= 0:
            producer = produced.pop(dep, 0.0)
            hop = hops[dep_stage]
        else:
            producer = hop = 0.0
        arrival_s = min(start, producer + hop)
        waited = max(0.0, min(start, producer) - prev_end)
        p2p = max(0.0, arrival_s - max(prev_end, producer))
        rest = max(0.0, start - prev_end - waited - p2p)  # link queue, or ZeRO-3 gather
        bubble += waited
        if zero3:
            pipeline_comm += p2p + 0.0
            dp_comm += rest
        else:
            pipeline_comm += p2p + rest
        chunk = chunks[c]
        gathering = gather(sh, unit, chunk.params) if zero3 else None
        length, tp, cp, ep, host_wait, recompute, host_s, ep_hidden = unit.costs[i]
        # The pass's tensor-parallel traffic, taken as one transfer after its kernels,
        # shares the node links with data-parallel collectives under way.
        tp_apart = node_links is not None and tp > 0.0 and length > host_s
        kernels = Wait(env, length - tp if tp_apart else length)
        # Gradient buckets fill as the pass runs. (Their readiness is scheduled after the
        # pass's kernels: at a tie, the pass ends first.)
        if buckets is not None:
            dp.bucketed(unit, chunk, buckets, start, length)
        yield kernels
        if tp_apart:
            assert node_links is not None
            yield from node_links.transfer(tp)
            shared_tp = env.now - start - length + tp
            length += shared_tp - tp
            tp = shared_tp
        extra = 0.0
        if comm_slowdown:
            # Kernels that shared the GPU with a collective ran slower by that overlap: a
            # data-parallel one, or the expert-parallel all-to-alls run beside them.
            if len(unit.spans) > unit.spans_from:
                extra = comm_slowdown * dp.overlap_s(unit, start)
            if ep_hidden:
                extra += comm_slowdown * ep_hidden
            if extra or zero3:
                # (Under ZeRO-3 even no slowdown takes its turn, so a bucket ready as the
                # pass ends queues before the next pass's weight gather, as it always did.)
                yield Wait(env, extra)
        if gathering is not None and not gathering.processed:
            held = env.now
            yield gathering
            dp_comm += env.now - held
        busy += length + extra
        slowdown += extra
        host_dispatch += host_wait
        if forward:
            forward_s += length - tp - cp - ep - host_wait
        else:
            recompute_s += recompute
            backward_s += length - tp - cp - ep - recompute - host_wait
        tp_comm += tp
        cp_comm += cp
        ep_comm += ep
        prev_end = produced[pid] = env.now
        if events is not None and prev_end > start:
            events.append(trace_event(compute_track, names[i], start, prev_end,
                                     "forward" if forward else "backward"))
        if send > 0:
            send_forward(pid)
        elif send < 0:
            send_backward(pid)
    backward_end = env.now
    if par.data > 1 and par.zero <= 1 and not par.overlap_grad_reduce:
        collective = "reduce_scatter" if par.zero == 1 else "all_reduce"
        label = f"{collective} gradients"
        dp.overlapped(unit, collective, st.trainable_params * sh.grad_bytes, label,
                      dp.label(label))
    if unit.outstanding:
        unit.drained = env.event()
        yield unit.drained
    dp_comm += env.now - backward_end
    if sh.tied_params and s in (0, par.pipeline - 1):
        # Megatron-LM then all-reduces the tied word-embedding gradients between the
        # first and last stage (its finalize step), before the optimizer.
        held = env.now
        met = env.event()
        sh.embedding.meet(unit.replica, 2, met.succeed)
        yield met
        start = env.now
        seconds = dp.collective_s("all_reduce", "embedding", sh.tied_params * sh.grad_bytes)
        yield Wait(env, seconds * sh.embedding_link(unit.replica))
        pipeline_comm += env.now - held
        if events is not None and env.now > start:
            events.append(trace_event(unit.tracks[2], "all_reduce tied embedding", start,
                                     env.now, "pipeline_comm"))
    start = env.now
    optimizer_s = st.optimizer_s * unit.compute
    yield Wait(env, optimizer_s)
    busy += optimizer_s
    if events is not None and env.now > start:
        events.append(trace_event(compute_track, "optimizer step", start, env.now, "optimizer"))
    if par.data > 1 and par.zero in (1, 2):
        start = env.now
        yield dp.reduced(unit, "all_gather", st.trainable_params * sh.weight_bytes,
                         "all_gather updated weights")
        dp_comm += env.now - start
    unit.busy = busy
    unit.acct = {"forward": forward_s, "backward": backward_s, "recompute": recompute_s,
                 "tensor_parallel_comm": tp_comm, "context_parallel_comm": cp_comm,
                 "expert_parallel_comm": ep_comm, "pipeline_bubble": bubble,
                 "pipeline_comm": pipeline_comm, "data_parallel_comm": dp_comm,
                 "comm_slowdown": slowdown, "host_dispatch": host_dispatch,
                 "optimizer": optimizer_s}
    unit.end = env.now
