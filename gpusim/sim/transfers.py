"""Pipeline transfers: a pass's output (activations forward, their gradients backward)
crossing the link to the stage that consumes it, one transfer at a time in each direction.

Passes are numbered within a replica (``pass_id``), so what a replica has produced and
what has landed are small dicts and sets keyed by int rather than one dict keyed by
(replica, kind, microbatch, virtual stage) tuples for the whole job.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import simpy

from gpusim.sim.calls import Call, Signal
from gpusim.sim.shared_link import SharedLink
from gpusim.sim.trace import TraceEvent, trace_event


def pass_id(backward: bool, micro: int, virtual_stage: int, virtual_stages: int) -> int:
    """A pass's number within its replica."""
    return (2 * micro + backward) * virtual_stages + virtual_stage


def send_names(microbatches: int, virtual_stages: int) -> list[str]:
    """Each pass's transfer's name in the trace, by pass number (one string for all)."""
    return [f"send {kind}{micro}" for micro in range(microbatches) for kind in "FB"
            for _ in range(virtual_stages)]


class Outputs:
    """One replica's pass outputs. ``produced``: when a pass finished; ``landed``: its
    output reached the stage that needs it; ``awaited``: what that stage waits on until
    then. Each output has one consumer, which takes its entries: they stay few."""

    __slots__ = ("awaited", "env", "landed", "produced")

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.produced: dict[int, float] = {}
        self.landed: set[int] = set()
        self.awaited: dict[int, Signal] = {}

    def land(self, pid: int) -> None:
        """A pass's output reached the stage that consumes it."""
        waiting = self.awaited.pop(pid, None)
        if waiting is None:
            self.landed.add(pid)
        else:
            waiting.succeed()

    def arrival(self, pid: int) -> Signal | None:
        """What to wait on for a pass's output; None once it is there."""
        if pid in self.landed:
            self.landed.remove(pid)
            return None
        event = self.awaited[pid] = Signal(self.env)
        return event


class Link:
    """A unit's link to the stage that consumes its outputs of one kind: one transfer at a
    time, in the order sent, each taking ``seconds`` (sharing the sender's NIC when given
    one). ``names[pid]`` names a transfer in the trace (None: no trace)."""

    __slots__ = ("crossing", "env", "events", "names", "nic", "outputs", "seconds", "since",
                 "track", "waiting")

    def __init__(self, env: simpy.Environment, outputs: Outputs, seconds: float,
                 nic: SharedLink | None, events: list[TraceEvent] | None,
                 track: str, names: list[str]) -> None:
        self.env, self.outputs, self.seconds, self.nic = env, outputs, seconds, nic
        self.events, self.track, self.names = events, track, names
        self.waiting: deque[int] = deque()
        self.crossing = -1  # the output under way (-1: none), since when
        self.since = 0.0

    def send(self, pid: int) -> None:
        if self.crossing < 0:
            self._cross(pid)
        else:
            self.waiting.append(pid)

    def _cross(self, pid: int) -> None:
        self.crossing, self.since = pid, self.env.now
        if self.nic is not None:
            self.nic.start(self.seconds, self._crossed)
        else:
            Call(self.env, self.seconds, self._crossed)

    def _crossed(self) -> None:
        pid, start = self.crossing, self.since
        events = self.events
        if events is not None:
            now = self.env.now
            if now > start:
                events.append(trace_event(self.track, self.names[pid], start, now,
                                         "pipeline_comm"))
        if self.waiting:
            self._cross(self.waiting.popleft())
        else:
            self.crossing = -1
        self.outputs.land(pid)


def sender(env: simpy.Environment, outputs: Outputs, seconds: float | None,
           nic: SharedLink | None, events: list[TraceEvent] | None, track: str,
           names: list[str]) -> Callable[[int], None]:
    """How a unit sends its outputs of one kind: over a link, or, to its own stage or
    where transfers take no time (``seconds`` None), straight to the consumer."""
    if seconds is None:
        return outputs.land
    return Link(env, outputs, seconds, nic, events, track, names).send
