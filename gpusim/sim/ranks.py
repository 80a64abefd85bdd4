"""Ranks of a parallel job, and the straggler option of the per-rank simulation.

Ranks are numbered as Megatron-LM numbers them: tensor-parallel index innermost, then data,
then pipeline (rank = stage x TP x DP + replica x TP + tensor index). A tensor-parallel group
synchronizes at every layer's collectives, so its ranks move in lockstep at the pace of the
slowest: the per-rank simulation runs one unit per (data-parallel replica, pipeline stage),
each standing for its TP ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpusim.errors import InvalidConfig


@dataclass(frozen=True)
class RankCoords:
    stage: int
    replica: int  # data-parallel index
    tensor: int


def rank_coords(rank: int, tensor: int, data: int, pipeline: int) -> RankCoords:
    """Where global ``rank`` sits in a TP x DP x PP job."""
    total = tensor * data * pipeline
    if not 0 <= rank < total:
        raise InvalidConfig(f"rank {rank} is not in this job (ranks 0 to {total - 1})")
    stage, rest = divmod(rank, tensor * data)
    replica, index = divmod(rest, tensor)
    return RankCoords(stage, replica, index)


@dataclass(frozen=True)
class Straggler:
    """One slow GPU or link. ``compute`` multiplies the time of the rank's kernels (a GPU at
    2/3 of its clock is 1.5); ``link`` multiplies the time of every transfer and collective
    the rank takes part in (a NIC at half its rate is 2.0). The rank's TP group keeps its pace;
    the rest of the job waits for it at the collectives it shares."""

    rank: int
    compute: float = 1.0
    link: float = 1.0

    def __post_init__(self) -> None:
        if self.compute < 1.0 or self.link < 1.0:
            raise InvalidConfig("a straggler's slowdown factors must be at least 1.0 "
                                f"(got compute {self.compute}, link {self.link})")

    @classmethod
    def parse(cls, text: str, kind: str) -> Straggler:
        """``RANK:FACTOR`` from the command line; ``kind`` is "compute" or "link"."""
        rank, sep, factor = text.partition(":")
        try:
            r, f = int(rank), float(factor) if sep else 0.0
        except ValueError:
            r, f = -1, 0.0
        if r < 0 or not 0 < f < math.inf or not text.isascii():
            raise InvalidConfig(f"give the straggler as RANK:FACTOR with a finite FACTOR "
                                f"above 0, e.g. 17:1.5 (got {text!r})")
        return cls(r, compute=f) if kind == "compute" else cls(r, link=f)

    def merge(self, other: Straggler | None) -> Straggler:
        """One straggler from a slow-GPU and a slow-link option naming the same rank."""
        if other is None:
            return self
        if other.rank != self.rank:
            raise InvalidConfig("the slow GPU and the slow link must be the same rank "
                                f"(got {self.rank} and {other.rank})")
        return Straggler(self.rank, max(self.compute, other.compute), max(self.link, other.link))
