"""Data-parallel collectives on each unit's communication stream.

A collective takes its turn on the unit's stream, in the order the unit issued it (and not
before its input is ready), then starts when every replica of the stage has reached it
(members match by label and by how many of that label each has issued), and runs at the
pace of the slowest member's link. Where the unit's NIC or node links are shared with other
traffic, it is done when the member slowed most by that traffic is: a second gate.

By ZeRO stage: 0 and 1 reduce gradients once per step (in buckets during the last backward
pass of each chunk with ``overlap_grad_reduce``, else one buffer after it); 2 and 3
reduce-scatter every backward pass's gradients in buckets as it runs; 3 also all-gathers
each pass's weights (``gather``). Hybrid sharding all-reduces each shard's buckets across
the shard groups.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import simpy

from gpusim.plan.chunk import ChunkPlan
from gpusim.plan.parallel import DDP_BUCKET_BYTES
from gpusim.plan.parallel_job import ParallelConfig
from gpusim.sim.calls import Call, Gates, Then
from gpusim.sim.trace import TraceEvent, trace_event
from gpusim.sim.unit import Unit


class DataParallel:
    """The data-parallel collectives of one simulated step.

    ``collective_s(collective, group, bytes)``: the plan's time for one; ``group_link[s]``:
    the slowest link factor among stage ``s``'s replicas; ``events``: the trace (None: no
    trace); ``comm_slowdown``: whether to keep the spans that slow the unit's kernels."""

    def __init__(self, env: simpy.Environment, par: ParallelConfig, replicas: int,
                 collective_s: Callable[[str, str, float], float], group_link: list[float],
                 grad_bytes: float, comm_slowdown: float, shared_links: bool,
                 events: list[TraceEvent] | None) -> None:
        self.env, self.par, self.replicas = env, par, replicas
        self.collective_s, self.group_link = collective_s, group_link
        self.grad_bytes = grad_bytes
        self.comm_slowdown, self.shared_links, self.events = comm_slowdown, shared_links, events
        # Who reached each collective, by stage: keyed by issue count and label number.
        self.starts = [Gates() for _ in group_link]
        self.ends = [Gates() for _ in group_link]
        self.labels: dict[str, int] = {}
        self._buckets: dict[tuple[int, str], tuple[list[str], list[int], list[str],
                                                   list[int]]] = {}
        self._bucket_plans: dict[int, list[tuple[float, float]]] = {}  # by chunk index

    def label(self, label: str) -> int:
        """The label's number (its collectives' counters and gates are kept by it)."""
        number = self.labels.get(label)
        if number is None:
            number = self.labels[label] = len(self.labels)
        return number

    def issue(self, unit: Unit, number: int) -> int:
        """Count the unit's collectives of one label: members match by it."""
        issued = unit.issued
        if number >= len(issued):
            issued.extend([0] * (number + 1 - len(issued)))
        nth = issued[number]
        issued[number] = nth + 1
        return nth

    def reduce(self, unit: Unit, collective: str, n_bytes: float, label: str, then: Then,
               group: str = "data", input_at: float = 0.0) -> None:
        """A collective issued now; ``then()`` when it is done. It holds its place on the
        stream from now, and starts no sooner than ``input_at``, when its input is ready."""
        number = self.label(label)
        _Collective(self, unit, collective, n_bytes, label, number,
                    self.issue(unit, number), then, group, input_at).go()

    def reduced(self, unit: Unit, collective: str, n_bytes: float, label: str,
                group: str = "data") -> simpy.Event:
        """A collective issued now; the event fires when it is done."""
        done = self.env.event()
        self.reduce(unit, collective, n_bytes, label, done.succeed, group)
        return done

    def overlapped(self, unit: Unit, collective: str, n_bytes: float, label: str,
                   number: int, ready_at: float = 0.0, group: str = "data") -> None:
        """A collective issued now that the unit's optimizer step waits for; it takes its
        turn on the stream once ready at ``ready_at``."""
        unit.outstanding += 1
        issued = _Collective(self, unit, collective, n_bytes, label, number,
                             self.issue(unit, number), None, group, 0.0)
        now = self.env.now
        if ready_at > now:
            Call(self.env, ready_at - now, issued.go)
        else:
            issued.go()

    def bucketed(self, unit: Unit, chunk: ChunkPlan, collective: str, start: float,
                 length: float) -> None:
        """Gradient buckets of a backward pass of ``length`` from ``start``, each reduced once
        its last gradient is complete (``ChunkPlan.grad_ready``)."""
        par = self.par
        if chunk.trainable_params == 0 or par.data == 1:
            return
        buckets = self._bucket_plan(chunk)
        count = len(buckets)
        labels, numbers, shard_labels, shard_numbers = self._bucket_labels(count, collective)
        group = "shard" if par.zero >= 2 else "data"
        for i, (at, n_bytes) in enumerate(buckets):
            self.overlapped(unit, collective, n_bytes, labels[i], numbers[i],
                            start + length * at, group)
        if par.shard_ranks < par.data:  # hybrid sharding: each shard all-reduced across groups
            for i, (at, n_bytes) in enumerate(buckets):
                self.overlapped(unit, "all_reduce", n_bytes / par.shard_ranks,
                                shard_labels[i], shard_numbers[i], start + length * at,
                                "replicate")

    def _bucket_plan(self, chunk: ChunkPlan) -> list[tuple[float, float]]:
        """(when in the pass, as a fraction of it, bytes) of each gradient bucket, in the
        order they fill. FSDP (ZeRO-3) reduce-scatters a unit, a block, at a time;
        otherwise gradients fill buckets of DDP_BUCKET_BYTES in the order they complete, as
        PyTorch DDP's reducer and DeepSpeed's reduce buckets do, a tensor larger than a
        bucket taking one of its own. Without a profile, buckets fill evenly."""
        known = self._bucket_plans.get(chunk.index)
        if known is not None:
            return known
        total = chunk.trainable_params * self.grad_bytes
        ready = chunk.grad_ready
        whole = math.fsum(gap for gap, _, _ in ready)
        out: list[tuple[float, float]] = []
        if whole <= 0.0:
            count = max(1, math.ceil(total / DDP_BUCKET_BYTES))
            out = [((i + 1) / count, total / count) for i in range(count)]
        else:
            at, fill, prev = 0.0, 0.0, 0.0
            for gap, params, new_block in ready:
                n_bytes = params * self.grad_bytes
                full = fill > 0.0 and (new_block if self.par.zero >= 3
                                       else fill + n_bytes > DDP_BUCKET_BYTES)
                if full:
                    out.append((prev, fill))
                    fill = 0.0
                at += gap
                fill, prev = fill + n_bytes, min(1.0, at / whole)
            out.append((1.0, fill))
        self._bucket_plans[chunk.index] = out
        return out

    def _bucket_labels(self, count: int, collective: str
                       ) -> tuple[list[str], list[int], list[str], list[int]]:
        """Bucket labels and their numbers, made once (every unit issues the same)."""
        known = self._buckets.get((count, collective))
        if known is None:
            labels = [f"{collective} bucket {i}" for i in range(count)]
            shard = [f"all_reduce shard bucket {i}" for i in range(count)]
            known = self._buckets[(count, collective)] = (
                labels, [self.label(x) for x in labels], shard, [self.label(x) for x in shard])
        return known

    def overlap_s(self, unit: Unit, start: float) -> float:
        """Seconds since ``start`` that the unit's collectives were on the wire."""
        spans, first = unit.spans, unit.spans_from
        while first < len(spans) and spans[first][1] <= start:
            first += 1  # over before this pass began: no later pass overlaps it either
        unit.spans_from = first
        if first > 64 and 2 * first > len(spans):
            unit.forget_spans()
            first = 0
        now = self.env.now
        return sum(max(0.0, min(spans[i][1], now) - max(spans[i][0], start))
                   for i in range(first, len(spans)))


def _settle(unit: Unit) -> None:
    unit.outstanding -= 1
    if unit.outstanding == 0 and unit.drained is not None:
        unit.drained.succeed()


class _Collective:
    """One collective of one unit, from its issue to its end (``then`` None: settle one of
    the unit's outstanding collectives)."""

    __slots__ = ("collective", "dp", "group", "input_at", "key", "label", "n_bytes", "seconds",
                 "start", "then", "unit")

    def __init__(self, dp: DataParallel, unit: Unit, collective: str, n_bytes: float,
                 label: str, number: int, nth: int, then: Then | None, group: str,
                 input_at: float) -> None:
        self.dp, self.unit, self.label, self.then = dp, unit, label, then
        self.collective, self.n_bytes, self.group = collective, n_bytes, group
        self.input_at = input_at
        self.key = (nth << 32) | number
        self.seconds = self.start = 0.0

    def go(self) -> None:
        """Its input is ready: take its turn on the stream (none where it takes no time)."""
        seconds = self.dp.collective_s(self.collective, self.group, self.n_bytes)
        if seconds == 0.0:
            self.done()
            return
        self.seconds = seconds * self.dp.group_link[self.unit.stage]
        self.unit.stream.submit(self.turn)

    def done(self) -> None:
        if self.then is None:
            _settle(self.unit)
        else:
            self.then()

    def turn(self) -> None:
        env = self.dp.env
        if self.input_at > env.now:
            Call(env, self.input_at - env.now, self.meet)
        else:
            self.meet()

    def meet(self) -> None:
        dp = self.dp
        dp.starts[self.unit.stage].meet(self.key, dp.replicas, self.begin)

    def begin(self) -> None:
        dp, unit = self.dp, self.unit
        start = self.start = dp.env.now
        seconds = self.seconds
        if dp.comm_slowdown:
            unit.spans.append((start, start + seconds))
        if dp.shared_links:  # done when the member slowed most by its NIC's or node
            # links' other traffic is
            link = unit.nic if unit.nic is not None else unit.node_links
            assert link is not None
            link.start(seconds, self.met_end)
        else:
            Call(dp.env, seconds, self.end)

    def met_end(self) -> None:
        dp = self.dp
        dp.ends[self.unit.stage].meet(self.key, dp.replicas, self.end)

    def end(self) -> None:
        dp, unit = self.dp, self.unit
        events = dp.events
        if events is not None:
            now = dp.env.now
            if now > self.start:
                events.append(trace_event(unit.tracks[2], self.label, self.start, now,
                                         "data_parallel_comm"))
        unit.stream.release()
        self.done()
