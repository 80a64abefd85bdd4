"""Progress of long work (sweeps, searches, comparisons), with rich: a live bar with the
time left on a terminal or in a notebook, and a plain line every few seconds in a log.

A ``ProgressBar`` is the ``progress`` callback the explore functions take::

    with ProgressBar("sweep", unit="points") as bar:
        sweep(settings, vary, progress=bar)
"""

from __future__ import annotations

import importlib.util
import sys
import time
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

# A log gets a line at most this often (a terminal's bar redraws itself instead).
LOG_EVERY_S = 10.0


def _live(console: Console) -> bool:
    """Whether a bar can redraw in place: a terminal, or a notebook with ipywidgets (rich
    draws there through them, and warns without them)."""
    if console.is_jupyter:
        return importlib.util.find_spec("ipywidgets") is not None
    return console.is_terminal and not console.is_dumb_terminal


class ProgressBar:
    """``bar(done, total[, name])`` reports ``done`` of ``total`` (``name``: what runs now).

    On a terminal or in a notebook the bar shows the count, the time so far and the time
    left; elsewhere (a log, a pipe) a line every ``log_every_s`` seconds says the same."""

    def __init__(self, label: str, *, unit: str = "", stream: TextIO | None = None,
                 log_every_s: float = LOG_EVERY_S) -> None:
        self.label = label
        self.unit = unit
        self.console = Console(file=stream or sys.stderr, highlight=False)
        self.live = _live(self.console)
        self.log_every_s = log_every_s
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn(unit), TimeElapsedColumn(), TextColumn("left"),
            TimeRemainingColumn(), TextColumn("{task.fields[name]}"),
            console=self.console, transient=False, disable=not self.live)
        self.task: TaskID | None = None
        self.started = time.perf_counter()
        self.logged = self.started

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def __call__(self, done: int, total: int, name: str = "") -> None:
        if self.task is None:
            self.task = self.progress.add_task(self.label, total=total, name=name)
            if self.live:
                self.progress.start()
        self.progress.update(self.task, completed=done, total=total, name=name)
        now = time.perf_counter()
        if not self.live and now - self.logged >= self.log_every_s and done < total:
            self.logged = now
            self.console.print(self.status(done, total))

    def status(self, done: int, total: int) -> str:
        """One line: how far, how long so far, about how long left."""
        left = None if self.task is None else self.progress.tasks[0].time_remaining
        eta = "" if left is None else f", about {left:,.0f} s left"
        unit = f" {self.unit}" if self.unit else ""
        return (f"{self.label}: {done:,} of {total:,}{unit} in "
                f"{time.perf_counter() - self.started:,.0f} s{eta}")

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def close(self) -> None:
        if self.live and self.task is not None:
            self.progress.stop()
        self.task = None
