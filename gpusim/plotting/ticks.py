"""Ticks the plots share: plain numbers on log axes, and ticks at round values of a display
unit (GiB, percent) over data kept in its base unit (bytes, a fraction)."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.ticker import (
    FixedLocator,
    FuncFormatter,
    Locator,
    LogLocator,
    MaxNLocator,
    NullLocator,
)


def plain(value: float) -> str:
    """A tick value without powers of ten where digits read better: 50,000 and 0.25."""
    return f"{value:,.0f}" if 1e4 <= abs(value) < 1e15 else f"{value:,.4g}"


PLAIN = FuncFormatter(lambda value, _: plain(value))
ROUND = (1, 2, 2.5, 5, 10)  # tick steps that read as round numbers (no 1.5, 4.5, 10.5)


def plain_log(axis: Any) -> None:
    """A log axis labelled 1, 2, 5, 10, 20, ... rather than in powers of ten."""
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(PLAIN)
    axis.set_minor_formatter(FuncFormatter(lambda *_: ""))


class ScaledLocator(Locator):
    """The ticks ``inner`` would choose for the data divided by ``scale``, in data units:
    round numbers of GiB over an axis of bytes."""

    def __init__(self, inner: Locator, scale: float) -> None:
        self.inner, self.scale = inner, scale

    def set_axis(self, axis: Any) -> None:
        super().set_axis(axis)
        self.inner.set_axis(axis)  # so that the inner locator sizes its ticks to the axis

    def __call__(self) -> Any:
        assert self.axis is not None, "a locator is called once it has an axis"
        low, high = self.axis.get_view_interval()
        return self.tick_values(low, high)

    def tick_values(self, vmin: float, vmax: float) -> Any:
        return np.asarray(self.inner.tick_values(vmin / self.scale, vmax / self.scale)) * self.scale


def at_values(axis: Any, values: list[float], most: int = 12) -> None:
    """Tick a log axis at each of a few ``values`` (the batch sizes a sweep tried), labelled
    plainly; with more than ``most`` of them, at 1, 2, 5, 10, ..."""
    distinct = sorted(set(values))
    if len(distinct) > most:
        plain_log(axis)
        return
    axis.set_major_locator(FixedLocator(distinct))
    axis.set_major_formatter(PLAIN)
    axis.set_minor_locator(NullLocator())


def show_scaled(axis: Any, scale: float, log: bool = False) -> None:
    """Tick ``axis`` (data in base units) at round values of the unit ``scale`` base units
    make, labelled in that unit. Call after setting the axis scale, which resets the ticks."""
    if scale == 1.0:
        return
    inner = LogLocator() if log else MaxNLocator(nbins="auto", steps=ROUND)
    axis.set_major_locator(ScaledLocator(inner, scale))
    axis.set_major_formatter(FuncFormatter(lambda value, _: plain(value / scale)))
    if log:
        axis.set_minor_locator(NullLocator())  # the base unit's minor ticks would fall between
