"""The discrete-event simulation of training steps on SimPy.

Processes and resources:
- loader workers prepare microbatches on the CPU into a bounded prefetch queue (staggered as
  in steady state, so a batch is ready every loader time / workers);
- the host thread takes a batch, starts its host-to-device copy on the copy engine, then
  dispatches every kernel (framework dispatch plus launch) into the compute stream's queue,
  and synchronizes at the end of each step (as reading the loss does);
- the compute stream runs kernels in order, each after its dependency (the copy) completes.

On a CPU device there is no separate stream: the host thread dispatches and computes.

Two steps are simulated and the second is measured, so the prefetch queue is in steady
state. With gradient accumulation of K microbatches, two are simulated in detail and the rest
repeat the last one (microbatches are identical); the result says so.

The engine only schedules: every duration comes from the step plan.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import simpy

from gpusim.plan.lower import Kernel, StepPlan
from gpusim.sim.trace import Trace, TraceEvent

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
    """Run ``SIMULATED_STEPS`` steps of ``plan`` and measure the last one."""
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
                    if on_gpu:
                        start = env.now
                        yield env.timeout(k.host_s)
                        events.append(TraceEvent("host", k.name, start, env.now, "dispatch"))
                        yield stream.put((k, dep if i == 0 else None, step, micro))
                    else:
                        yield from run_on_cpu(k, step, micro)
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
