"""A device comparison as a picture: ranked bars of time to train and cost, and the
time-versus-cost plane with its Pareto front (the devices no other beats on both)."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display is assumed

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from gpusim import units
from gpusim.explore.compare import Comparison
from gpusim.plotting.placement import fit_bar_labels, place_labels
from gpusim.plotting.ticks import plain_log

RENT, OWN = "#4C72B0", "#55A868"
# (below this many seconds, seconds in one unit, its name, its symbol)
TIME_UNITS = ((2.0, units.MS, "milliseconds", "ms"), (120.0, 1.0, "seconds", "s"),
              (2 * units.HOUR, 60.0, "minutes", "min"), (3 * units.DAY, units.HOUR, "hours", "h"))


def train_time_unit(seconds: float) -> tuple[float, str, str]:
    """(seconds in one unit, its name, its symbol) that show times up to ``seconds`` in a
    few digits: a one-step run in milliseconds, a week-long one in days."""
    for limit, scale, name, symbol in TIME_UNITS:
        if seconds < limit:
            return scale, name, symbol
    return units.DAY, "days", "days"


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (lower is better),
    ordered by the first coordinate."""
    order = sorted(range(len(points)), key=lambda i: points[i])
    front: list[int] = []
    best = float("inf")
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def _label(row: Comparison) -> str:
    return f"{row.num_devices} x {row.device.name}" if row.num_devices > 1 else row.device.name


def staircase(front: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """The edge of what a Pareto front (points by rising time, so falling cost) beats: from
    each point across at its cost to the next one's time, then down to the next."""
    xs, ys = [front[0][0]], [front[0][1]]
    for x, y in front[1:]:
        xs += [x, x]
        ys += [ys[-1], y]
    return xs, ys


def compare_figure(rows: list[Comparison]) -> Figure:
    """Left: time to train per device, best at the top. Right: cost against time, rented
    (cloud) and owned, with the Pareto front of each: dashed steps through the devices no
    other beats on both, ringed. Times are in the unit that suits the longest run."""
    runs = [r for r in rows if r.result is not None and r.cost is not None]
    fig = Figure(figsize=(12, max(3.5, 0.45 * len(rows) + 1.5)), layout="constrained")
    bars, plane = fig.subplots(1, 2, width_ratios=[1, 1.2])
    seconds = [r.result.time_to_train_s for r in runs]  # type: ignore[union-attr]
    scale, unit, symbol = train_time_unit(max(seconds, default=units.HOUR))
    times = [s / scale for s in seconds]
    ys = range(len(runs))
    bars.barh(ys, times, color=RENT)
    values = [bars.annotate(f"{t:,.3g} {symbol}", (t, y), xytext=(3, 0),
                            textcoords="offset points", va="center", fontsize=8)
              for y, t in zip(ys, times, strict=True)]
    skipped = [r for r in rows if r.result is None]
    bars.set_yticks(list(ys), [_label(r) for r in runs])
    bars.invert_yaxis()
    bars.set_xscale("log")
    plain_log(bars.xaxis)
    bars.set_xlabel(f"time to train ({unit}, log scale)")
    bars.set_title("time to train" + (f" ({len(skipped)} do not run: "
                                      f"{', '.join(r.device.name for r in skipped)})"
                                      if skipped else ""), fontsize=10)
    labelled: list[tuple[tuple[float, float], str, str]] = []
    handles: list[Any] = []
    for kind, color, marker in (("cloud", RENT, "o"), ("own", OWN, "s")):
        pts, unpriced = [], []
        for r, t in zip(runs, times, strict=True):
            assert r.cost is not None
            usd = r.cost.cloud_usd if kind == "cloud" else r.cost.ownership_usd
            if usd is None:
                unpriced.append(r.device.name)
            else:
                pts.append((t, usd, _label(r)))
        if not pts:
            continue
        name = "rent (cloud on-demand)" if kind == "cloud" else "own (purchase share + power)"
        if unpriced:
            name += f"; no price for {', '.join(unpriced)}"
        handles.append(plane.scatter([p[0] for p in pts], [p[1] for p in pts], color=color,
                                     marker=marker, label=name, zorder=3))
        front = [pts[i][:2] for i in pareto_front([(p[0], p[1]) for p in pts])]
        plane.plot(*staircase(front), color=color, linestyle="--", linewidth=1, zorder=2)
        plane.scatter([p[0] for p in front], [p[1] for p in front], s=160,
                      facecolors="none", edgecolors=color, linewidths=1, zorder=3)
        labelled += [((t, usd), label, color) for t, usd, label in pts]
    plane.set_xscale("log")
    plane.set_yscale("log")
    plain_log(plane.xaxis)
    plain_log(plane.yaxis)
    plane.margins(0.08)
    plane.set_xlabel(f"time to train ({unit})")
    plane.set_ylabel("cost of the run (USD)")
    plane.set_title("cost against time; dashed: Pareto front (nothing beats it on both)",
                    fontsize=10)
    plane.grid(True, which="both", alpha=0.3)
    if handles:
        handles.append(Line2D([], [], color="grey", linestyle="--", linewidth=1, marker="o",
                              markersize=11, markerfacecolor="none",
                              label="Pareto front: no device both faster and cheaper"))
        plane.legend(handles=handles, fontsize=8, loc="upper center",
                     bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    fit_bar_labels(bars, values)  # these move the layout; the labels of points come after
    if labelled:
        place_labels(plane, [p for p, _, _ in labelled], [t for _, t, _ in labelled],
                     [c for _, _, c in labelled])
    return fig
