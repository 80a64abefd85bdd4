"""SimPy's environment with its event queue kept by instant.

SimPy keeps every pending event in one heap ordered by (time, priority, insertion). In a
per-rank simulation the replicas of a stage do the same thing at the same instants, so
nine events in ten fall on an instant that already has one, and the heap of a 32,768-GPU
step holds thousands of entries that each push and pop climb. Here the heap holds each
pending instant once; the ordinary (NORMAL) events of an instant wait in a FIFO in the order
they were scheduled, and the rare others (URGENT process starts, SimPy's own -1) in a small
heap of their own that is served first. The order is SimPy's exactly: by time, then
priority, then insertion. Each event keeps its own time object (an int 0 stays an int).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from heapq import heappop, heappush
from typing import Any

import simpy
from simpy.core import EmptySchedule, Infinity, StopSimulation
from simpy.events import NORMAL, EventPriority, Initialize


class Clock(simpy.Environment):
    def __init__(self) -> None:
        super().__init__()
        self._instants: list[Any] = []  # heap of the instants with events pending
        self._normal: dict[Any, deque[tuple[Any, Any]]] = {}  # instant -> (time, event)
        self._first: dict[Any, list[tuple[int, int, Any, Any]]] = {}  # (priority, eid, ...)

    def schedule(self, event: Any, priority: EventPriority = NORMAL, delay: Any = 0) -> None:
        at = self._now + delay
        if priority == NORMAL:
            due = self._normal.get(at)
            if due is None:
                due = self._normal[at] = deque()
                if at not in self._first:
                    heappush(self._instants, at)
            due.append((at, event))
        else:
            first = self._first.get(at)
            if first is None:
                first = self._first[at] = []
                if at not in self._normal:
                    heappush(self._instants, at)
            heappush(first, (priority, next(self._eid), at, event))

    def peek(self) -> Any:
        return self._instants[0] if self._instants else Infinity

    def _next(self) -> Any:
        """The next event, its instant's entries dropped once empty."""
        instants, normal, first = self._instants, self._normal, self._first
        while instants:
            at = instants[0]
            if first:
                urgent = first.get(at)
                if urgent:
                    _, _, self._now, event = heappop(urgent)
                    return event
                if urgent is not None:
                    del first[at]
            due = normal.get(at)
            if due:
                self._now, event = due.popleft()
                return event
            if due is not None:
                del normal[at]
            heappop(instants)
        raise EmptySchedule

    def step(self) -> None:
        """Process the next event, as simpy.Environment.step does."""
        event = self._next()
        callbacks, event.callbacks = event.callbacks, None
        try:
            for callback in callbacks:
                callback(event)
        except StopSimulation:
            event.callbacks = callbacks[callbacks.index(callback) + 1:]
            self.schedule(event, EventPriority(-1))
            raise
        if not event._ok and not hasattr(event, "_defused"):
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc


class Stream(simpy.Event):
    """A generator run on the clock, as ``simpy.Process`` runs one, for generators that
    wait only on events that succeed: started by an URGENT event now, resumed by each event
    it yields, and, once it returns, an event that succeeds (so ``simpy.AllOf`` can wait on
    it). It reuses one bound method for all its waits, where a Process makes one per wait."""

    def __init__(self, env: simpy.Environment, generator: Generator[Any, Any, Any]) -> None:
        super().__init__(env)
        self._generator = generator
        self._resume = self._resume_with  # the callback it leaves on what it waits for
        Initialize(env, self)  # type: ignore[arg-type]

    def _resume_with(self, event: Any) -> None:
        try:
            if event._ok:
                target = self._generator.send(event._value)
            else:  # (none of the simulator's events fail; as SimPy does, should one)
                event._defused = True
                target = self._generator.throw(event._value)
        except StopIteration as stop:
            self._ok = True
            self._value = stop.value
            self.env.schedule(self)
            return
        target.callbacks.append(self._resume)
