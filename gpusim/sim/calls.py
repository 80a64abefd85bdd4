"""Callbacks on SimPy's clock without a process or a ``simpy.Timeout``, and a queue that
runs one job at a time.

A ``Call`` is an entry in the environment's event queue like any event (scheduled through
``Environment.schedule``, so it takes its place among same-time events in the same order a
Timeout would), but it holds one callback in a shared tuple rather than a list and a closure
of its own: a step of a thousand-GPU simulation schedules hundreds of thousands of them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import simpy
from simpy.events import NORMAL

Then = Callable[[], object]  # what to do when something is over


def _run(call: Call) -> None:
    call.then()


_RUN = (_run,)


class Call:
    """``then()`` once ``delay`` seconds have passed. It cannot be yielded by a process
    (SimPy's ``Environment.step`` only reads its callbacks and ``_ok``)."""

    __slots__ = ("callbacks", "then")
    _ok = True  # it never fails

    def __init__(self, env: simpy.Environment, delay: float, then: Then) -> None:
        self.then = then
        self.callbacks: tuple[Callable[[Call], None], ...] | None = _RUN
        env.schedule(self, NORMAL, delay)  # type: ignore[arg-type]


class Wait:
    """What a process yields to wait ``delay`` seconds: a simpy.Timeout without an
    instance dict (one per pass of every unit)."""

    __slots__ = ("_value", "callbacks")
    _ok = True  # it never fails

    def __init__(self, env: simpy.Environment, delay: float) -> None:
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        self._value = None
        self.callbacks: list[Callable[[Wait], None]] | None = []
        env.schedule(self, NORMAL, delay)  # type: ignore[arg-type]


class Signal:
    """What a process yields to wait for something to happen (``succeed()``): a
    simpy.Event without an instance dict, for the inputs units wait on."""

    __slots__ = ("_value", "callbacks", "env")
    _ok = True  # it never fails

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self._value = None
        self.callbacks: list[Callable[[Signal], None]] | None = []

    def succeed(self) -> None:
        self.env.schedule(self, NORMAL, 0)  # type: ignore[arg-type]


class Fifo:
    """One job at a time, in the order they come: a simpy.Resource of capacity 1 without
    the request and release events. A job is called when its turn comes and calls
    ``release()`` when it is done."""

    __slots__ = ("busy", "queue")

    def __init__(self) -> None:
        self.busy = False
        self.queue: deque[Then] = deque()

    def submit(self, job: Then) -> None:
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


class Gates:
    """Collectives that start (or end) when every member has reached them: the callbacks
    of those that have, in the order they came, by key."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting: dict[object, list[Then]] = {}

    def meet(self, key: object, members: int, then: Then) -> None:
        """``then()`` for each of ``members`` members of ``key``, in the order they reached
        it, once the last has."""
        if members == 1:
            then()
            return
        waiting = self.waiting.get(key)
        if waiting is None:
            waiting = self.waiting[key] = [then]
        else:
            waiting.append(then)
        if len(waiting) == members:
            del self.waiting[key]
            for go in waiting:
                go()
