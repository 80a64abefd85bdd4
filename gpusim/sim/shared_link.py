"""A link that concurrent transfers share: each of k transfers crossing it moves at 1/k of
its own rate (processor sharing), so two that overlap both finish later than either would
alone, and the pair takes as long as running them back to back.

Each transfer schedules one timeout for when it would finish at its current share; when a
transfer starts or ends, the others count the work they moved so far and schedule anew
(their old timeout, now stale, is ignored when it fires). No process runs per transfer, and
a timeout is a slotted entry in SimPy's queue (``_Timer``) rather than a Timeout with a
closure: every pipeline transfer of a per-rank simulation whose links are shared takes one."""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from typing import Any

import simpy
from simpy.events import NORMAL

_DONE = 1e-12  # seconds of work left that count as finished (floating-point slack)


class _Flow:
    """One transfer under way: work left as of ``since``, at ``share`` of the link's rate,
    due to finish at ``due`` (when its live timeout fires; -inf once finished)."""

    __slots__ = ("due", "on_done", "remaining", "share", "since")

    def __init__(self, seconds: float, on_done: Callable[[], object]) -> None:
        self.remaining = seconds
        self.since = 0.0
        self.share = 1.0
        self.due = math.nan
        self.on_done = on_done


def _expire(timer: _Timer) -> None:
    timer.link._expire(timer.flow, timer.due)


_EXPIRE = (_expire,)


class _Timer:
    """When ``flow`` would end, as of its latest share (stale once its ``due`` moved on)."""

    __slots__ = ("callbacks", "due", "flow", "link")
    _ok = True  # read by simpy.Environment.step

    def __init__(self, link: SharedLink, flow: _Flow, due: float, delay: float) -> None:
        self.link, self.flow, self.due = link, flow, due
        self.callbacks: tuple[Callable[[_Timer], None], ...] | None = _EXPIRE
        link.env.schedule(self, NORMAL, delay)  # type: ignore[arg-type]


class SharedLink:
    __slots__ = ("_flows", "active", "env")

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.active = 0
        self._flows: list[_Flow] = []

    def transfer(self, seconds: float) -> Generator[simpy.Event, Any, None]:
        """Occupy the link for a transfer that alone would take ``seconds``."""
        done = self.env.event()
        self.start(seconds, done.succeed)
        yield done

    def start(self, seconds: float, on_done: Callable[[], object]) -> None:
        """Begin a transfer that alone would take ``seconds``; ``on_done()`` when it ends."""
        flow = _Flow(seconds, on_done)
        self.active += 1
        if self._flows:
            self._reshare()
        if seconds > _DONE:
            self._flows.append(flow)
            self._schedule(flow)
        else:
            self._finish([flow])

    def _schedule(self, flow: _Flow) -> None:
        """Move at 1/active of the rate from now on: a fresh timeout for the new end."""
        now = self.env.now
        flow.since, flow.share = now, 1.0 / self.active
        delay = flow.remaining / flow.share
        due = now + delay
        if due != flow.due:  # else the live timeout already fires then
            flow.due = due
            _Timer(self, flow, due, delay)

    def _expire(self, flow: _Flow, due: float) -> None:
        if flow.due == due:  # neither superseded nor finished since
            # Its own time ran out: done, whatever is left after rounding (late in a long
            # simulation one tick of the clock exceeds any fixed slack).
            self._flows.remove(flow)
            self._finish([flow])

    def _reshare(self) -> None:
        """The number of transfers changed: each other one counts the work it moved at its
        old share and goes on at the new one. One whose own timeout fires at this very
        moment is left to it (it finishes then, having moved all its work)."""
        now = self.env.now
        finished = []
        for flow in self._flows:
            if flow.due == now:
                continue
            flow.remaining -= (now - flow.since) * flow.share
            if flow.remaining > _DONE:
                self._schedule(flow)
            else:
                finished.append(flow)
        if finished:
            for flow in finished:
                self._flows.remove(flow)
            self._finish(finished)

    def _finish(self, flows: list[_Flow]) -> None:
        self.active -= len(flows)
        for flow in flows:
            flow.due = -math.inf
        if self._flows:
            self._reshare()
        for flow in flows:
            flow.on_done()
