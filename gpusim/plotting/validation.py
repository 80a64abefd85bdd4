"""Predicted against measured: whole steps and layers on log axes, with the ideal line."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display is assumed

from matplotlib.figure import Figure

from gpusim.validate.compare import DeviceReport


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
        for rep, points in zip(reports, series, strict=True):
            if points:
                ax.scatter([m for m, _ in points], [p for _, p in points], s=14, alpha=0.7,
                           label=f"{rep.device} ({len(points)})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured time (s)")
        ax.set_ylabel("predicted time (s)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle("gpusim predictions against measured PyTorch runs")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path
