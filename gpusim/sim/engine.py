"""The discrete-event simulation of training steps on SimPy.

Processes and resources:
- loader workers prepare microbatches on the CPU into a bounded prefetch queue (staggered as
  in steady state, so a batch is ready every loader time / workers);
- the host thread takes a batch, starts its host-to-device copy on the copy engine, then
  dispatches every kernel (framework dispatch plus launch) into the compute stream's queue,
  and synchronizes at the end of each step (as reading the loss does), and before the
  optimizer step where the stack reads a value there (a gradient norm's ``.item()``);
- the compute stream runs kernels in order, each after its dependency (the copy) completes.

On a CPU device there is no separate stream: the host thread dispatches and computes.

Two steps are simulated and the second is measured, so the prefetch queue is in steady
state. With gradient accumulation of K microbatches, two are simulated in detail and the rest
repeat the last one (microbatches are identical); the result says so.

SimPy runs the loader and the prefetch queue and steps the host once per microbatch pass;
the kernels of a pass (the host's dispatches, then the device running the queue) are computed
in a loop, with the float operations one process step per kernel would do, in its order. A
step with two processes recording something at one instant runs one process step per kernel
(``_simulate_events``), the event queue ordering them.

The engine only schedules: every duration comes from the step plan.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import simpy

from gpusim.plan.lower import Kernel, StepPlan
from gpusim.sim.trace import Trace, TraceEvent, trace_event

SIMULATED_STEPS = 2
DETAILED_MICROBATCHES = 2
PREFETCH_PER_WORKER = 2  # PyTorch DataLoader's default prefetch_factor


@dataclass(frozen=True)
class SimResult:
    """The measured step: its duration, where the time went, and every event."""

    step_time_s: float
    breakdown_s: dict[str, float]
    busy_s: float
    kernels_per_step: int
    extrapolated_microbatches: int
    trace: Trace


class _Step:
    """Time accounting per (step, microbatch) bucket; 'tail' is the optimizer and sync."""

    def __init__(self) -> None:
        self.buckets: dict[tuple[int, Any], dict[str, float]] = defaultdict(
            lambda: defaultdict(float))

    def add(self, step: int, micro: Any, key: str, seconds: float) -> None:
        if seconds > 0:
            self.buckets[(step, micro)][key] += seconds


def simulate(plan: StepPlan, *, on_gpu: bool) -> SimResult:
    """Run ``SIMULATED_STEPS`` steps of ``plan`` and measure the last one.

    SimPy steps once per microbatch pass, each pass's kernels computed in a loop
    (``_schedule``); where two processes would record something at one instant, whose order
    only the event queue decides, it steps once per kernel (``_simulate_events``). Both give
    the same result, bit for bit (tests/test_engine_speed.py)."""
    fast = _schedule(plan, on_gpu)
    if fast is None:
        return _simulate_events(plan, on_gpu=on_gpu)
    acct, events = fast
    return _result(plan, acct, events)


# Which process records a trace event; at one instant, records of different processes come
# in this order where the event queue fixes it (a loader's batch before the host's wait that
# it ends; the last kernel before the synchronize it ends); any other tie goes to SimPy.
_LOADER, _COMPUTE, _HOST, _COPY = range(4)  # copies: one process each, _COPY + n
_WAIT, _SYNC = "wait for batch", "synchronize"


def _schedule(plan: StepPlan, on_gpu: bool) -> tuple[_Step, list[TraceEvent]] | None:
    """The steps on SimPy with one event per microbatch pass instead of one per kernel.

    SimPy runs the loader workers and the prefetch queue as ``_simulate_events`` does; the
    host takes each batch from it and then computes its microbatch in a plain loop: it
    dispatches kernel i at ``dispatched += host_s``, and (after the optimizer) the device
    starts each kernel once it is dispatched and the kernel before is done, the first of a
    microbatch also once its input copy is (``gpusim.plan.pass_cost.Queue``'s recurrence).
    The host then waits one timeout to the pass's end. The same float operations run in the
    same order as one process step per kernel, so the times and sums are the same. None
    where that order is not the trace's: two processes recording at one instant (the event
    queue orders them), or a pass's end that a timeout cannot land on exactly."""
    workers = plan.loader_workers
    detailed = min(plan.accum, DETAILED_MICROBATCHES)
    if not plan.microbatch or (workers and not plan.loader_s_per_microbatch / workers > 0):
        return None
    env = simpy.Environment()
    batches = simpy.Store(env, capacity=max(1, workers * PREFETCH_PER_WORKER))
    acct = _Step()
    add = acct.add
    # (append time, process, record) per process, each in its own order
    loader_recs: list[tuple[float, int, TraceEvent]] = []
    host_recs: list[tuple[float, int, TraceEvent]] = []
    compute_recs: list[tuple[float, int, TraceEvent]] = []
    copy_recs: list[tuple[float, int, TraceEvent]] = []
    loaded: list[float] = []  # when each batch was ready
    got: list[float] = []  # when the host took each batch
    landed = [True]  # every pass ended exactly where its timeout did

    def loader() -> Any:
        interval = plan.loader_s_per_microbatch / workers
        for i in range(SIMULATED_STEPS * detailed):
            yield env.timeout(interval)
            now = env.now
            loaded.append(now)
            loader_recs.append((now, _LOADER, trace_event(
                "loader", f"batch (worker {i % workers})",
                max(0.0, now - plan.loader_s_per_microbatch), now, "input")))
            yield batches.put(i)

    def until(t: float) -> Any:
        """Wait to ``t``, where the loop left the host."""
        if t != env.now:
            yield env.timeout(t - env.now)
            if env.now != t:
                landed[0] = False

    def drain(items: list[tuple[Kernel | None, float | None, int, Any, float,
                                tuple[float, float]]],
              t: float, free: float) -> tuple[float, float]:
        """The device runs the queued ``items`` up to the host's synchronize (the last
        item), which the host, at ``t``, waits for: the host's and the device's times
        after it."""
        for kernel, dep, kstep, micro, queued, (w0, w1) in items:
            now = free
            if queued > free:  # the queue ran dry (else both terms are 0)
                now = queued
                waited = max(0.0, min(now, w1) - max(free, w0))
                add(kstep, micro, "input_pipeline", waited)
                add(kstep, micro, "host_dispatch", now - free - waited)
            if kernel is None:  # the synchronize: the queue has drained
                host_recs.append((now, _HOST, trace_event("host", _SYNC, t, now, "sync")))
                return now, now
            if dep is not None and dep > now:
                add(kstep, micro, "input_pipeline", dep - now)
                now = dep
            end = now + kernel.device_s
            add(kstep, micro, kernel.phase, kernel.device_s)
            compute_recs.append((end, _COMPUTE, trace_event(
                "compute", kernel.name, now, end, kernel.phase)))
            free = end
        return t, free

    def host() -> Any:
        copy_s = plan.input_copy_s
        last = len(plan.microbatch) - 1
        free = 0.0  # when the device next looks for work
        window = (0.0, 0.0)  # the host's latest wait for a batch
        for step in range(SIMULATED_STEPS):
            # for the device: (kernel or None, copy done, step, micro, queued at, host's wait)
            items: list[tuple[Kernel | None, float | None, int, Any, float,
                              tuple[float, float]]] = []
            for micro in range(detailed):
                dep: float | None = None
                t = env.now
                if workers:
                    wait_start = t
                    yield batches.get()
                    t = env.now
                    got.append(t)
                    window = (wait_start, t)
                    if t > wait_start:
                        host_recs.append((t, _HOST, trace_event("host", _WAIT, wait_start, t,
                                                                "input")))
                        if not on_gpu:
                            add(step, micro, "input_pipeline", t - wait_start)
                    if on_gpu:
                        dep = t + copy_s
                        copy_recs.append((dep, _COPY + len(copy_recs), trace_event(
                            "copy", "input H2D", t, dep, "input")))
                    else:
                        t = t + copy_s
                for i, k in enumerate(plan.microbatch):
                    if on_gpu and k.syncs:  # the host reads a value back first
                        items.append((None, None, step, micro, t, window))
                        t, free = drain(items, t, free)
                        items = []
                    start = t
                    t = t + k.host_s
                    if on_gpu:
                        host_recs.append((t, _HOST, trace_event("host", k.name, start, t,
                                                                "dispatch")))
                        # the host starts waiting for the next batch as the last is queued
                        seen = ((t, t) if i == last and workers and micro < detailed - 1
                                else window)
                        items.append((k, dep if i == 0 else None, step, micro, t, seen))
                    else:
                        add(step, micro, "host_dispatch", k.host_s)
                        mid = t
                        t = t + k.device_s
                        add(step, micro, k.phase, k.device_s)
                        host_recs.append((t, _HOST, trace_event("host", k.name, start, t,
                                                                k.phase)))
                        host_recs.append((t, _HOST, trace_event("compute", k.name, mid, t,
                                                                k.phase)))
                yield from until(t)
                if not landed[0]:
                    return
            t = env.now
            if on_gpu and plan.sync_before_optimizer:  # the host reads a value first
                items.append((None, None, step, "tail", t, window))
                t, free = drain(items, t, free)
                items = []
            for k in plan.optimizer:
                start = t
                t = t + k.host_s
                if on_gpu:
                    host_recs.append((t, _HOST, trace_event("host", k.name, start, t,
                                                            "dispatch")))
                    items.append((k, None, step, "tail", t, window))
                else:
                    add(step, "tail", "host_dispatch", k.host_s)
                    mid = t
                    t = t + k.device_s
                    add(step, "tail", k.phase, k.device_s)
                    host_recs.append((t, _HOST, trace_event("host", k.name, start, t,
                                                            k.phase)))
                    host_recs.append((t, _HOST, trace_event("compute", k.name, mid, t,
                                                            k.phase)))
            if on_gpu:  # the device runs the step's queue; the host synchronizes
                items.append((None, None, step, "tail", t, window))
                t, free = drain(items, t, free)
            yield from until(t)
            if not landed[0]:
                return

    if workers:
        env.process(loader())
    env.run(until=env.process(host()))
    if not landed[0] or any(when == ready and m != i
                            for i, ready in enumerate(loaded)
                            for m, when in enumerate(got)):
        return None  # a batch taken as another is queued: the event queue orders them
    merged = loader_recs + compute_recs + copy_recs + host_recs
    merged.sort(key=_when)  # stable: each process keeps its order
    for (t0, p0, _), (t1, p1, e1) in pairwise(merged):
        if t0 == t1 and p0 != p1 and not (
                (p0 == _LOADER and p1 == _HOST and e1.name is _WAIT)
                or (p0 == _COMPUTE and p1 == _HOST and e1.name is _SYNC)):
            return None
    return acct, [e for _, _, e in merged]


def _when(rec: tuple[float, int, TraceEvent]) -> float:
    return rec[0]


def _simulate_events(plan: StepPlan, *, on_gpu: bool) -> SimResult:
    """The steps on SimPy, one process step per kernel (what ``_schedule`` computes)."""
    env = simpy.Environment()
    events: list[TraceEvent] = []
    acct = _Step()
    detailed = min(plan.accum, DETAILED_MICROBATCHES)
    total_batches = SIMULATED_STEPS * detailed
    workers = plan.loader_workers
    batches = simpy.Store(env, capacity=max(1, workers * PREFETCH_PER_WORKER))
    stream = simpy.Store(env)
    input_wait = [0.0, 0.0]  # the host's latest wait for a batch: [from, until]
    step_ends: list[float] = []

    def loader() -> Any:
        """Workers in steady state, staggered: a batch is ready every loader time / workers."""
        interval = plan.loader_s_per_microbatch / workers
        for i in range(total_batches):
            yield env.timeout(interval)
            start = max(0.0, env.now - plan.loader_s_per_microbatch)
            events.append(TraceEvent("loader", f"batch (worker {i % workers})", start, env.now,
                                     "input"))
            yield batches.put(i)

    def copy(done: simpy.Event) -> Any:
        start = env.now
        yield env.timeout(plan.input_copy_s)
        events.append(TraceEvent("copy", "input H2D", start, env.now, "input"))
        done.succeed()

    def run_on_cpu(k: Kernel, step: int, micro: Any) -> Any:
        start = env.now
        yield env.timeout(k.host_s)
        acct.add(step, micro, "host_dispatch", k.host_s)
        mid = env.now
        yield env.timeout(k.device_s)
        acct.add(step, micro, k.phase, k.device_s)
        events.append(TraceEvent("host", k.name, start, env.now, k.phase))
        events.append(TraceEvent("compute", k.name, mid, env.now, k.phase))

    def host() -> Any:
        for step in range(SIMULATED_STEPS):
            for micro in range(detailed):
                dep = None
                if workers:
                    wait_start = input_wait[0] = input_wait[1] = env.now
                    yield batches.get()
                    input_wait[1] = env.now
                    if env.now > wait_start:
                        events.append(TraceEvent("host", "wait for batch", wait_start, env.now,
                                                 "input"))
                        if not on_gpu:
                            acct.add(step, micro, "input_pipeline", env.now - wait_start)
                    if on_gpu:
                        dep = env.event()
                        env.process(copy(dep))
                    else:
                        yield env.timeout(plan.input_copy_s)
                for i, k in enumerate(plan.microbatch):
                    if on_gpu and k.syncs:  # the host reads a value back first
                        done = env.event()
                        sync_start = env.now
                        yield stream.put((None, done, step, micro))
                        yield done
                        events.append(TraceEvent("host", "synchronize", sync_start, env.now,
                                                 "sync"))
                    if on_gpu:
                        start = env.now
                        yield env.timeout(k.host_s)
                        events.append(TraceEvent("host", k.name, start, env.now, "dispatch"))
                        yield stream.put((k, dep if i == 0 else None, step, micro))
                    else:
                        yield from run_on_cpu(k, step, micro)
            if on_gpu and plan.sync_before_optimizer:  # the host reads a value first
                done = env.event()
                sync_start = env.now
                yield stream.put((None, done, step, "tail"))
                yield done
                events.append(TraceEvent("host", "synchronize", sync_start, env.now, "sync"))
            for k in plan.optimizer:
                if on_gpu:
                    start = env.now
                    yield env.timeout(k.host_s)
                    events.append(TraceEvent("host", k.name, start, env.now, "dispatch"))
                    yield stream.put((k, None, step, "tail"))
                else:
                    yield from run_on_cpu(k, step, "tail")
            if on_gpu:
                done = env.event()
                sync_start = env.now
                yield stream.put((None, done, step, "tail"))
                yield done
                events.append(TraceEvent("host", "synchronize", sync_start, env.now, "sync"))
            step_ends.append(env.now)

    def account_idle(step: int, micro: Any, idle_from: float) -> None:
        """An empty queue means the host is behind: waiting for a batch, or dispatching."""
        waited = max(0.0, min(env.now, input_wait[1]) - max(idle_from, input_wait[0]))
        acct.add(step, micro, "input_pipeline", waited)
        acct.add(step, micro, "host_dispatch", env.now - idle_from - waited)

    def compute_stream() -> Any:
        while True:
            idle_from = env.now
            kernel, dep, step, micro = yield stream.get()
            account_idle(step, micro, idle_from)
            if kernel is None:  # the host's synchronize marker: the queue has drained
                dep.succeed()
                continue
            if dep is not None and not dep.processed:
                wait_from = env.now
                yield dep
                acct.add(step, micro, "input_pipeline", env.now - wait_from)
            start = env.now
            yield env.timeout(kernel.device_s)
            acct.add(step, micro, kernel.phase, kernel.device_s)
            events.append(TraceEvent("compute", kernel.name, start, env.now, kernel.phase))

    if workers:
        env.process(loader())
    if on_gpu:
        env.process(compute_stream())
    env.run(until=env.process(host()))
    return _result(plan, acct, events)


def _result(plan: StepPlan, acct: _Step, events: list[TraceEvent]) -> SimResult:
    detailed = min(plan.accum, DETAILED_MICROBATCHES)
    measured = SIMULATED_STEPS - 1
    breakdown: dict[str, float] = defaultdict(float)
    for (step, micro), bucket in acct.buckets.items():
        if step != measured:
            continue
        repeat = 1 + (plan.accum - detailed if micro == detailed - 1 else 0)
        for key, seconds in bucket.items():
            breakdown[key] += seconds * repeat
    keys = ("forward", "backward", "recompute", "optimizer", "input_pipeline",
            "host_dispatch", "gpu_idle")
    result = {key: breakdown.get(key, 0.0) for key in keys}
    busy = sum(result[k] for k in ("forward", "backward", "recompute", "optimizer"))
    step_time = sum(result.values())
    kernels = len(plan.microbatch) * plan.accum + len(plan.optimizer)
    return SimResult(step_time, result, busy, kernels, plan.accum - detailed,
                     Trace(tuple(events)))
