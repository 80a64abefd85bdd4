"""The pipeline simulation's clock and cheap events keep SimPy's order exactly.

``Clock`` keeps its queue by instant; ``Call``, ``Wait`` and ``Signal`` are queue entries
without SimPy's Event machinery; ``Stream`` runs a generator as ``simpy.Process`` does. Each
is checked against SimPy itself on the same random program: the same callbacks must run at
the same times in the same order, ties at one instant included. ``trace_event`` must make
the same record as ``TraceEvent``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator
from typing import Any

import pytest
import simpy
from simpy.events import URGENT

from gpusim.sim.calls import Call, Signal, Wait
from gpusim.sim.clock import Clock, Stream
from gpusim.sim.trace import TraceEvent, trace_event

Log = list[tuple[float, str]]


def _program(env: simpy.Environment, log: Log, seed: int, cheap: bool) -> None:
    """Processes that wait on timeouts (often at one instant), signal each other, and leave
    callbacks on the clock, some at delay 0 and some URGENT; ``cheap`` uses the simulator's
    own events and streams where SimPy's would be."""
    rng = random.Random(seed)
    signals: list[Any] = []

    def later(delay: float, then: Callable[[], object]) -> None:
        if cheap:
            Call(env, delay, then)
        else:
            env.timeout(delay).callbacks.append(lambda _: then())

    def urgent(name: str) -> None:
        event = simpy.Event(env)
        event._ok, event._value = True, None
        event.callbacks.append(lambda _: log.append((env.now, f"urgent {name}")))
        env.schedule(event, URGENT, 0)

    def worker(i: int) -> Generator[Any, Any, None]:
        for step in range(30):
            delay = rng.choice([0.0, 0.5, 1.0, 1.0, 2.0, rng.random()])
            yield Wait(env, delay) if cheap else env.timeout(delay)
            log.append((env.now, f"worker {i} step {step}"))
            if rng.random() < 0.3:
                later(rng.choice([0.0, 1.0]), lambda i=i, step=step: log.append(
                    (env.now, f"call {i}.{step}")))
            if rng.random() < 0.1:
                urgent(f"{i}.{step}")
            if signals and rng.random() < 0.3:
                signals.pop(0).succeed()
            if rng.random() < 0.2:
                signal = Signal(env) if cheap else env.event()
                signals.append(signal)
                yield signal
                log.append((env.now, f"worker {i} signalled at {step}"))
        while signals:
            signals.pop(0).succeed()

    for i in range(12):
        proc = Stream(env, worker(i)) if cheap else env.process(worker(i))
        proc.callbacks.append(lambda _, i=i: log.append((env.now, f"worker {i} ended")))
    env.run()  # (a worker left waiting for a signal nobody sends is fine)


@pytest.mark.parametrize("seed", range(8))
def test_the_clock_and_its_events_run_callbacks_in_simpys_order(seed: int) -> None:
    expected: Log = []
    _program(simpy.Environment(), expected, seed, cheap=False)
    got: Log = []
    _program(Clock(), got, seed, cheap=True)
    assert got == expected
    assert len(expected) > 300


def test_an_event_keeps_its_own_time_at_an_instant_it_shares() -> None:
    """At time 0 SimPy's clock reads an int for events scheduled from its int start with
    an int delay and a float for a float delay; the clock keeps each event's own."""
    env = Clock()
    seen: list[object] = []
    Call(env, 0.0, lambda: seen.append(env.now))
    event = simpy.Event(env)
    event._ok, event._value = True, None
    event.callbacks.append(lambda _: seen.append(env.now))
    env.schedule(event, delay=0)
    env.run()
    assert [type(t) for t in seen] == [float, int]


def test_a_run_that_waits_for_what_never_happens_says_so() -> None:
    env = Clock()

    def stuck() -> Generator[Any, Any, None]:
        yield Signal(env)

    with pytest.raises(RuntimeError, match="No scheduled events left"):
        env.run(until=simpy.AllOf(env, [Stream(env, stuck())]))


def test_a_negative_wait_is_refused() -> None:
    with pytest.raises(ValueError, match="negative delay"):
        Wait(Clock(), -1.0)


def test_a_fast_trace_record_is_a_trace_event() -> None:
    made = trace_event("stage 0 compute", "F0", 0.5, 1.25, "forward")
    assert type(made) is TraceEvent
    assert made == TraceEvent("stage 0 compute", "F0", 0.5, 1.25, "forward")
    assert hash(made) == hash(TraceEvent("stage 0 compute", "F0", 0.5, 1.25, "forward"))
    assert made.duration_s == 0.75
