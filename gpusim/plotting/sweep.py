"""A sweep as a picture: lines over one numeric field, a heatmap over two, bars over none.

Points that do not fit are gaps in a line and grey cells in a heatmap: the plot shows where
the feasible region ends rather than hiding it.
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display is assumed

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from gpusim.errors import InvalidConfig
from gpusim.explore.sweep import METRICS, SweepResult
from gpusim.explore.values import is_number
from gpusim.plotting.fields import label, quantity
from gpusim.plotting.ticks import ROUND, ScaledLocator, at_values, plain, show_scaled

PLOTTABLE = tuple(m for m in METRICS if m not in ("fits", "error"))
MAX_PANELS = 12  # heatmaps side by side; more is unreadable
# Marker and line style of each line in turn, so that lines that coincide stay visible: later
# lines draw smaller hollow markers inside earlier ones, and dashes over solid lines.
STYLES = (("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."), ("v", (0, (5, 1, 1, 1))),
          ("P", (0, (1, 2))), ("X", (0, (8, 2))))
# Relative difference at every point below which two lines are the same, and below which
# they are drawn over each other at any size a plot is read at; the legend says which.
SAME, NEAR = 1e-9, 0.01


def sweep_figure(result: SweepResult, metric: str = "step_time_s") -> Figure:
    """Plot ``metric`` over the sweep: with one numeric varied field a line per combination
    of the other fields; with two or more, a heatmap of the first two (one panel per
    combination of the rest); with none, one bar per point. Axes name fields and metrics in
    words with their units (``fields.quantity``); lines that coincide keep distinct markers
    and dashes, and the legend names the line each one hides."""
    if metric not in PLOTTABLE:
        raise InvalidConfig(f"cannot plot {metric!r}; metrics: {', '.join(PLOTTABLE)}")
    numeric = [f for f in result.fields if all(is_number(v) for v in result.column(f))]
    if len(numeric) >= 2:
        return _heatmaps(result, metric, numeric[0], numeric[1])
    if numeric:
        return _lines(result, metric, numeric[0])
    return _bars(result, metric)


def _value(row: dict[str, Any], metric: str) -> float:
    value = row[metric]
    return float(value) if value is not None else math.nan


def _label(row: dict[str, Any], fields: list[str]) -> str:
    return ", ".join(quantity(f).setting(row[f]) for f in fields)


def _groups(result: SweepResult, rest: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Rows by the values of the ``rest`` fields, in grid order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in result.rows:
        groups.setdefault(_label(row, rest), []).append(row)
    return groups


def _title(result: SweepResult, metric: str, shown_as: str) -> str:
    failed = result.infeasible  # the unit is on the axis
    return quantity(metric).words + (
        f" ({failed} of {len(result.rows)} points do not run: {shown_as})" if failed else "")


def _wide(values: list[float]) -> bool:
    """Log axes when the values span more than about a decade and a half."""
    finite = [v for v in values if math.isfinite(v)]
    return bool(finite) and min(finite) > 0 and max(finite) / min(finite) >= 20


def _coincide(a: list[float], b: list[float], rtol: float) -> bool:
    """Whether two lines' values agree to ``rtol`` everywhere (both missing agrees)."""
    x, y = np.asarray(a, float), np.asarray(b, float)
    if x.shape != y.shape or not np.array_equal(np.isnan(x), np.isnan(y)):
        return False
    ran = ~np.isnan(x)
    return bool(ran.any()) and bool(np.allclose(x[ran], y[ran], rtol=rtol, atol=0.0))


def _twin(xs: list[float], ys: list[float],
          drawn: list[tuple[str, list[float], list[float]]]) -> str:
    """What the legend adds to a line that another one drawn before it hides."""
    for rtol, words in ((SAME, "same as"), (NEAR, f"within {NEAR:.0%} of")):
        for name, other_xs, other_ys in drawn:
            if other_xs == xs and _coincide(other_ys, ys, rtol):
                return f" ({words} {name})"
    return ""


def _lines(result: SweepResult, metric: str, x: str) -> Figure:
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()
    rest = [f for f in result.fields if f != x]
    drawn: list[tuple[str, list[float], list[float]]] = []
    for i, (name, rows) in enumerate(_groups(result, rest).items()):
        xs, ys = [float(r[x]) for r in rows], [_value(r, metric) for r in rows]
        marker, style = STYLES[i % len(STYLES)]
        ax.plot(xs, ys, marker=marker, linestyle=style, markersize=max(9.0 - 1.5 * i, 4.0),
                markerfacecolor="none", markeredgewidth=1.5, alpha=0.85,
                label=(name or label(metric)) + _twin(xs, ys, drawn))
        drawn.append((name, xs, ys))
    xs = [float(v) for v in result.column(x)]
    ys = [_value(r, metric) for r in result.rows]
    if _wide(xs):
        ax.set_xscale("log")
        at_values(ax.xaxis, xs)
    if _wide(ys):
        ax.set_yscale("log")
    show_scaled(ax.yaxis, quantity(metric).scale, log=_wide(ys))
    ax.set_xlabel(label(x))
    ax.set_ylabel(label(metric))
    ax.set_title(_title(result, metric, "gaps"))
    ax.grid(True, alpha=0.3)
    if rest:
        ax.legend(fontsize="small")
    return fig


def _heatmaps(result: SweepResult, metric: str, x: str, y: str) -> Figure:
    rest = [f for f in result.fields if f not in (x, y)]
    groups = _groups(result, rest)
    if len(groups) > MAX_PANELS:
        raise InvalidConfig(f"a heatmap of {x} and {y} needs one panel per value of "
                            f"{', '.join(rest)}: {len(groups)} is more than {MAX_PANELS}")
    xs = list(dict.fromkeys(result.column(x)))
    ys = list(dict.fromkeys(result.column(y)))
    fig = Figure(figsize=(min(6 * len(groups), 18), 5), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(groups), squeeze=False)[0])
    finite = [v for v in (_value(r, metric) for r in result.rows) if math.isfinite(v)]
    low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
    scale = quantity(metric).scale
    for ax, (name, rows) in zip(axes, groups.items(), strict=True):
        grid = np.full((len(ys), len(xs)), np.nan)
        for row in rows:
            grid[ys.index(row[y]), xs.index(row[x])] = _value(row, metric)
        image = ax.imshow(np.ma.masked_invalid(grid), origin="lower", aspect="auto",
                          cmap=_cmap(), vmin=low, vmax=high)
        if len(xs) * len(ys) <= 144:  # numbers in the cells while they stay legible
            for (i, j), value in np.ndenumerate(grid):
                if math.isfinite(value):
                    dark = (value - low) < 0.5 * (high - low)  # viridis is dark at the low end
                    ax.text(j, i, f"{value / scale:.3g}", ha="center", va="center", fontsize=7,
                            color="white" if dark else "black")
        names = [f"{v:g}" for v in xs]
        ax.set_xticks(range(len(xs)), names, rotation=45 if max(map(len, names)) > 4 else 0)
        ax.set_yticks(range(len(ys)), [f"{v:g}" for v in ys])
        ax.set_xlabel(label(x))
        ax.set_ylabel(label(y))
        ax.set_title(name or _title(result, metric, "grey"), fontsize="medium")
    fig.colorbar(image, ax=list(axes), label=label(metric),
                 ticks=ScaledLocator(MaxNLocator(nbins="auto", steps=ROUND), scale),
                 format=FuncFormatter(lambda value, _: plain(value / scale)))
    if rest:
        fig.suptitle(_title(result, metric, "grey"))
    return fig


def _cmap() -> Any:
    return matplotlib.colormaps["viridis"].with_extremes(bad="lightgrey")  # do not run


def _bars(result: SweepResult, metric: str) -> Figure:
    fig = Figure(figsize=(max(6, 0.6 * len(result.rows)), 5), layout="constrained")
    ax = fig.subplots()
    fields = list(result.fields)
    names = ([str(r[fields[0]]) for r in result.rows] if len(fields) == 1
             else [_label(r, fields) for r in result.rows])
    ax.bar(range(len(names)), [_value(r, metric) for r in result.rows], color="#4C72B0")
    long = max(map(len, names), default=0) > 8
    ax.set_xticks(range(len(names)), names, rotation=45 if long else 0,
                  ha="right" if long else "center")
    show_scaled(ax.yaxis, quantity(metric).scale)
    if len(fields) == 1:
        ax.set_xlabel(label(fields[0]))
    ax.set_ylabel(label(metric))
    ax.set_title(_title(result, metric, "no bar"))
    return fig
