"""A device comparison as a picture: ranked bars of time to train and cost, and the
time-versus-cost plane with its Pareto front (the devices no other beats on both)."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display is assumed

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator

from gpusim.explore.compare import Comparison

RENT, OWN = "#4C72B0", "#55A868"
_PLAIN = FuncFormatter(lambda value, _: f"{value:,.4g}")


def _plain_log(axis: Any) -> None:
    """A log axis labelled 1, 2, 5, 10, 20, ... rather than in powers of ten."""
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(_PLAIN)
    axis.set_minor_formatter(FuncFormatter(lambda *_: ""))


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


def compare_figure(rows: list[Comparison]) -> Figure:
    """Left: time to train per device, best at the top. Right: cost against time, rented
    (cloud) and owned, with the Pareto front of each."""
    runs = [r for r in rows if r.result is not None and r.cost is not None]
    fig = Figure(figsize=(12, max(3.5, 0.45 * len(rows) + 1.5)), layout="constrained")
    bars, plane = fig.subplots(1, 2, width_ratios=[1, 1.2])
    hours = [r.result.time_to_train_s / 3600 for r in runs]  # type: ignore[union-attr]
    labels = [_label(r) for r in runs]
    ys = range(len(runs))
    bars.barh(ys, hours, color=RENT)
    for y, h in zip(ys, hours, strict=True):
        bars.annotate(f" {h:,.3g} h", (h, y), va="center", fontsize=8)
    skipped = [r for r in rows if r.result is None]
    bars.set_yticks(list(ys), labels)
    bars.invert_yaxis()
    bars.set_xscale("log")
    _plain_log(bars.xaxis)
    bars.set_xlabel("time to train (hours, log scale)")
    bars.set_title("time to train" + (f" ({len(skipped)} do not run: "
                                      f"{', '.join(r.device.name for r in skipped)})"
                                      if skipped else ""), fontsize=10)
    for kind, color, marker in (("cloud", RENT, "o"), ("own", OWN, "s")):
        pts = []
        for r, h in zip(runs, hours, strict=True):
            assert r.cost is not None
            usd = r.cost.cloud_usd if kind == "cloud" else r.cost.ownership_usd
            if usd is not None:
                pts.append((h, usd, _label(r)))
        if not pts:
            continue
        name = "rent (cloud on-demand)" if kind == "cloud" else "own (purchase share + power)"
        plane.scatter([p[0] for p in pts], [p[1] for p in pts], color=color, marker=marker,
                      label=name, zorder=3)
        front = pareto_front([(p[0], p[1]) for p in pts])
        plane.plot([pts[i][0] for i in front], [pts[i][1] for i in front], color=color,
                   linestyle="--", linewidth=1, zorder=2)
        for h, usd, label in pts:
            plane.annotate(label, (h, usd), textcoords="offset points", xytext=(4, 4),
                           fontsize=7, color=color)
    plane.set_xscale("log")
    plane.set_yscale("log")
    _plain_log(plane.xaxis)
    _plain_log(plane.yaxis)
    plane.set_xlabel("time to train (hours)")
    plane.set_ylabel("cost of the run (USD)")
    plane.set_title("cost against time; dashed: Pareto front (nothing beats it on both)",
                    fontsize=10)
    plane.grid(True, which="both", alpha=0.3)
    if plane.get_legend_handles_labels()[0]:
        plane.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2,
                     frameon=False)
    return fig
