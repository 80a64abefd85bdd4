"""Predicted against measured: whole steps and layers on log axes, with the ideal line."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display is assumed

from matplotlib.collections import PathCollection
from matplotlib.figure import Figure

from gpusim.validate.compare import DeviceReport

CROWDED = 500  # points of one device in a panel past which markers shrink and fade


def validation_figure(reports: list[DeviceReport], path: str | Path) -> Path:
    """Two panels (training steps, then per-layer forward/backward), one colour per device,
    the y = x line and a ±10% band; writes ``path`` (PNG, SVG or PDF by its suffix)."""
    fig = Figure(figsize=(12, 5.5))
    axes = fig.subplots(1, 2)
    panels = [
        ("Training step", [[(r.measured_s, r.predicted_s) for r in rep.rows]
                           for rep in reports]),
        ("Layers (forward and backward)", [[(lay.measured_s, lay.predicted_s)
                                            for r in rep.rows for lay in r.layers]
                                           for rep in reports]),
    ]
    for ax, (title, series) in zip(axes, panels, strict=True):
        values = [v for points in series for p in points for v in p]
        if not values:
            ax.set_title(f"{title}: no data")
            continue
        lo, hi = min(values) / 1.5, max(values) * 1.5
        ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="predicted = measured")
        ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="grey",
                        alpha=0.2, label="±10%")
        crowded = max(len(points) for points in series) > CROWDED
        for rep, points in zip(reports, series, strict=True):
            if points:  # crowded, smaller and fainter: one device's cloud no longer hides another's
                ax.scatter([m for m, _ in points], [p for _, p in points],
                           s=5 if crowded else 14, alpha=0.25 if crowded else 0.7,
                           linewidths=0, label=f"{rep.device} ({len(points)})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured time (s)")
        ax.set_ylabel("predicted time (s)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        legend = ax.legend(loc="upper left", fontsize=8, markerscale=2 if crowded else 1)
        for handle in legend.legend_handles:
            if isinstance(handle, PathCollection):
                handle.set_alpha(1.0)  # the key shows each device's colour at full strength
    fig.suptitle("gpusim predictions against measured PyTorch runs")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path
