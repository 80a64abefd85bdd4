"""Scaling curves: throughput against GPUs beside the ideal linear line, and scaling
efficiency. GPU counts that do not run are marked on the efficiency panel's floor."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # files only; no display is assumed

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, ScalarFormatter

from gpusim.errors import InvalidConfig
from gpusim.explore.scaling import ScalingRow
from gpusim.plotting.ticks import plain_log


def _gpu_axis(ax: Axes, counts: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(counts))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(FixedLocator([]))
    ax.set_xlabel("GPUs")
    ax.grid(True, which="both", alpha=0.3)


def scaling_figure(rows: Sequence[ScalingRow], title: str | None = None) -> Figure:
    """Two panels over the GPU count (log2): throughput (tokens/s when every point has
    tokens, else samples/s) with the ideal line from the smallest count that runs, and
    efficiency in percent."""
    ran = [r for r in rows if r.fits and r.samples_per_s is not None]
    if not ran:
        raise InvalidConfig("no GPU count runs, so there is no scaling curve to draw"
                            + (f" (first error: {rows[0].error})" if rows else ""))
    tokens = all(r.tokens_per_s is not None for r in ran)
    unit = "tokens/s" if tokens else "samples/s"
    rate = [float((r.tokens_per_s if tokens else r.samples_per_s) or 0.0) for r in ran]
    gpus = [r.num_gpus for r in ran]
    counts = sorted({r.num_gpus for r in rows})
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2)
    # The ideal lines draw over the predictions: where scaling is perfect the two coincide,
    # and grey dashes on the coloured line still show both.
    left.plot(counts, [rate[0] * n / gpus[0] for n in counts], color="grey", ls="--",
              label=f"linear from {gpus[0]} GPU{'s' if gpus[0] > 1 else ''}", zorder=3)
    left.plot(gpus, rate, marker="o", label="predicted", zorder=2)
    left.set_yscale("log")
    plain_log(left.yaxis)
    left.set_ylabel(f"throughput ({unit})")
    left.set_title("Throughput")
    right.axhline(100, color="grey", ls="--", label="ideal", zorder=3)
    right.plot(gpus, [100 * (r.efficiency or 0.0) for r in ran], marker="o", color="C1",
               label="predicted", zorder=2)
    failed = [r.num_gpus for r in rows if not r.fits]
    if failed:
        right.plot(failed, [0] * len(failed), "x", color="C3", ms=10, mew=2, clip_on=False,
                   label="does not run")
    top = max(110.0, *(100 * (r.efficiency or 0.0) + 10 for r in ran))
    right.set_ylim(0, top)
    right.set_ylabel("scaling efficiency (%)")
    right.set_title("Efficiency: throughput per GPU over the first that runs")
    for ax in (left, right):
        _gpu_axis(ax, counts)
        # below the panel: inside, it covered the crosses on the floor or the curves
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8,
                  frameon=False)
    note = f"; {len(failed)} of {len(rows)} GPU counts do not run" if failed else ""
    fig.suptitle((title or "Scaling") + note)
    return fig
