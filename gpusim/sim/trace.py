"""The trace of a simulated step: one record per kernel, copy, load or wait, and its export
to the Chrome/Perfetto trace format (open the file at ui.perfetto.dev or chrome://tracing).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """Something that occupied a track from ``start_s`` to ``end_s`` (seconds)."""

    track: str
    name: str
    start_s: float
    end_s: float
    category: str

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


_SET = tuple(TraceEvent.__dict__[field].__set__
             for field in ("track", "name", "start_s", "end_s", "category"))


def trace_event(track: str, name: str, start_s: float, end_s: float,
                category: str) -> TraceEvent:
    """``TraceEvent(track, name, start_s, end_s, category)`` in half the time: the frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``, and a per-rank
    simulation records millions."""
    event = object.__new__(TraceEvent)
    set_track, set_name, set_start, set_end, set_category = _SET
    set_track(event, track)
    set_name(event, name)
    set_start(event, start_s)
    set_end(event, end_s)
    set_category(event, category)
    return event


# Tracks in display order; each becomes a thread of one process in the trace viewer.
TRACK_ORDER = ("host", "loader", "copy", "compute")


def _natural(track: str) -> list[object]:
    """Sort key that puts "stage 2" before "stage 10"."""
    return [(0, int(part)) if part.isdigit() else (1, part)
            for part in re.split(r"(\d+)", track)]


@dataclass(frozen=True)
class Trace:
    events: tuple[TraceEvent, ...]

    def tracks(self) -> list[str]:
        present = {e.track for e in self.events}
        ordered = [t for t in TRACK_ORDER if t in present]
        return ordered + sorted(present - set(ordered), key=_natural)

    def to_chrome(self) -> dict[str, object]:
        """The trace as a Chrome trace-event JSON object (times in microseconds)."""
        tids = {track: i for i, track in enumerate(self.tracks())}
        rows: list[dict[str, object]] = [
            {"ph": "M", "pid": 0, "tid": tid, "name": "thread_name", "args": {"name": track}}
            for track, tid in tids.items()
        ]
        rows.append({"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "gpusim"}})
        for e in self.events:
            rows.append({"ph": "X", "pid": 0, "tid": tids[e.track], "name": e.name,
                         "cat": e.category, "ts": e.start_s * 1e6,
                         "dur": max(e.duration_s, 0.0) * 1e6})
        return {"traceEvents": rows, "displayTimeUnit": "ms"}

    def write_chrome(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_chrome()))
        return path
