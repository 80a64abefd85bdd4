"""One simulated unit: a data-parallel replica of a pipeline stage, standing for its
tensor-parallel group (see ``gpusim.sim.ranks``). It holds its data-parallel stream and
what it has issued there, the links it shares, its trace tracks and, once its step is over,
its accounting."""

from __future__ import annotations

from collections.abc import Callable

import simpy

from gpusim.sim.accounting import PassCosts
from gpusim.sim.calls import Fifo
from gpusim.sim.shared_link import SharedLink

STREAMS = ("compute", "p2p", "dp comm")


class Unit:
    __slots__ = ("acct", "busy", "compute", "costs", "drained", "end", "issued", "link", "nic",
                 "node_links", "outstanding", "replica", "senders", "spans", "spans_from",
                 "stage", "stream", "tracks")

    def __init__(self, replica: int, stage: int, replicas: int, compute: float = 1.0,
                 link: float = 1.0) -> None:
        self.replica, self.stage = replica, stage
        self.compute, self.link = compute, link  # slowdowns of its kernels and its links
        self.acct: dict[str, float] = {}  # its breakdown's terms, once its step is over
        self.busy = 0.0  # compute-stream seconds
        self.end = 0.0  # when its step ended (0 until then)
        self.stream = Fifo()  # its data-parallel communication stream
        # Its collectives on the wire, as (start, nominal end), in the order they started;
        # those before spans_from ended before the pass under way began, so no pass still
        # to come overlaps them.
        self.spans: list[tuple[float, float]] = []
        self.spans_from = 0
        self.outstanding = 0  # collectives its passes issued that have not finished
        self.drained: simpy.Event | None = None  # fires when they have, once awaited
        self.issued: list[int] = []  # collectives issued so far, by label number
        self.nic: SharedLink | None = None  # shared by pipeline and data-parallel traffic
        self.node_links: SharedLink | None = None  # by tensor- and data-parallel traffic
        self.costs: list[PassCosts] = []  # of each of its passes, in schedule order
        # How it sends its outputs forward and their gradients backward, by pass number.
        self.senders: tuple[Callable[[int], None], Callable[[int], None]] | None = None
        prefix = f"stage {stage} " if replicas == 1 else f"stage {stage} dp {replica} "
        self.tracks = tuple(prefix + stream for stream in STREAMS)

    def forget_spans(self) -> None:
        """Drop the spans no pass still to come overlaps, so the list stays short."""
        del self.spans[:self.spans_from]
        self.spans_from = 0
