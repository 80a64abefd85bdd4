"""The roofline of a device with the kernels of one training step placed on it.

Each kernel sits at (its FLOPs over the bytes it moves, its FLOPs over its device time), so
its distance below the roof is what the cost model says it loses to tiles, waves, launch
overhead and small sizes. Kernels repeated with the same shape (the same op in every block of
a transformer) are merged into one marker sized by their summed share of the step's device
time. Kernels without FLOPs (copies, gathers, casts) cannot be placed; the title counts them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import matplotlib

matplotlib.use("Agg")  # files only; no display is assumed

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from gpusim import units
from gpusim.hardware.profile import DeviceProfile
from gpusim.plan.lower import Kernel, StepPlan
from gpusim.plotting.timeline import OTHER_COLOR, PHASE_COLORS
from gpusim.workload.numerics import FP32, Numerics

BOUND_COLORS = {"compute": "#4C72B0", "memory": "#DD8452"}
FLOOR = 1e-4  # achieved FLOP/s below this fraction of the highest roof are not drawn
_INDEX = re.compile(r"\.\d+(?=\.|$)")  # block and chunk numbers in kernel names


@dataclass
class _Point:
    """Kernels of one shape and phase: where they sit and the device time they take."""

    name: str
    phase: str
    bound: str
    intensity: float  # FLOP/byte
    flops_per_s: float
    count: int = 0
    seconds: float = 0.0

    def label(self, share: float) -> str:
        name = _INDEX.sub(".*", self.name) if self.count > 1 else self.name
        times = f" ×{self.count}" if self.count > 1 else ""
        return f"{name} ({self.phase}){times}: {share:.0%}"


def _weighted(kernels: StepPlan | Sequence[Kernel]) -> list[tuple[Kernel, int]]:
    """Each kernel with the times it runs per step (a plan repeats its microbatch)."""
    if isinstance(kernels, StepPlan):
        return ([(k, kernels.accum) for k in kernels.microbatch]
                + [(k, 1) for k in kernels.optimizer])
    return [(k, 1) for k in kernels]


def _points(kernels: list[tuple[Kernel, int]]) -> dict[tuple[object, ...], _Point]:
    points: dict[tuple[object, ...], _Point] = {}
    for k, times in kernels:
        if k.flops <= 0 or k.bytes <= 0 or k.device_s <= 0:
            continue
        key = (_INDEX.sub("", k.name), k.phase, k.flops, k.bytes, k.device_s)
        point = points.setdefault(key, _Point(k.name, k.phase, k.bound, k.flops / k.bytes,
                                              k.flops / k.device_s))
        point.count += times
        point.seconds += times * k.device_s
    return points


def _roofs(ax: Axes, device: DeviceProfile, numerics: Numerics, x_max: float) -> float:
    """Draw the bandwidth slope and each distinct compute roof; the highest roof (FLOP/s)."""
    bandwidth = device.memory_bandwidth
    roofs: dict[float, str] = {}
    for dtype, matrix in ((numerics.matmul, True), (numerics.conv, True),
                          (numerics.activation, False)):
        peak, unit = device.peak_flops(dtype, matrix=matrix)  # type: ignore[arg-type]
        roofs.setdefault(peak, f"{unit} {dtype}")
    top = max(roofs)
    ridge = top / bandwidth
    xs = np.geomspace(1e-3, ridge, 50)
    ax.plot(xs, xs * bandwidth / units.TERA, color="black", lw=1.5,
            label=f"memory bandwidth {device.memory_bandwidth_gb_s:g} GB/s")
    for i, (peak, name) in enumerate(sorted(roofs.items(), reverse=True)):
        ax.plot([peak / bandwidth, max(x_max, ridge) * 100], [peak / units.TERA] * 2,
                color="black", lw=1.5, ls=("-", "--", ":")[i],
                label=f"{name} peak {peak / units.TERA:.3g} TFLOP/s")
    return top


def roofline_figure(kernels: StepPlan | Sequence[Kernel], device: DeviceProfile, *,
                    numerics: Numerics = FP32, color_by: Literal["phase", "bound"] = "phase",
                    top: int = 5, title: str | None = None) -> Figure:
    """The roofline of ``device`` (the bandwidth slope; the matrix and vector peaks of
    ``numerics``, as ``TrainingJob.numerics()`` gives them) on log-log axes of FLOP/byte
    against TFLOP/s, with the kernels of a step plan (or any kernels) coloured by phase or
    by what bounds them, sized by their share of device time; the ``top`` kernels that take
    the most time are labelled."""
    weighted = _weighted(kernels)
    total_s = sum(k.device_s * times for k, times in weighted) or 1.0
    points = list(_points(weighted).values())
    fig = Figure(figsize=(12, 6.5), layout="constrained")
    ax = fig.subplots()
    roof = _roofs(ax, device, numerics, max((p.intensity for p in points), default=1.0))
    shown = [p for p in points if p.flops_per_s >= FLOOR * roof]
    colors = BOUND_COLORS if color_by == "bound" else PHASE_COLORS
    group_of = {id(p): p.bound if color_by == "bound" else p.phase for p in shown}
    groups = sorted(set(group_of.values()), key=list(colors).index)
    for group in groups:
        members = [p for p in shown if group_of[id(p)] == group]
        ax.scatter([p.intensity for p in members], [p.flops_per_s / units.TERA for p in members],
                   s=[12 + 2000 * p.seconds / total_s for p in members], alpha=0.6,
                   color=colors.get(group, OTHER_COLOR), edgecolors="white", linewidths=0.5)
    leaders = sorted(shown, key=lambda p: -p.seconds)[:top]
    spots: dict[tuple[float, float], list[str]] = {}  # leaders that would overprint
    for rank, p in enumerate(leaders, 1):
        spot = (p.intensity, p.flops_per_s / units.TERA)
        near = next((s for s in spots if math.dist(np.log10(s), np.log10(spot)) < 0.1), spot)
        spots.setdefault(near, []).append(str(rank))
    for spot, ranks in spots.items():
        ax.annotate(",".join(ranks), spot, xytext=(5, 3), textcoords="offset points",
                    fontsize=8, weight="bold")
    ax.set_xscale("log")
    ax.set_yscale("log")
    xs = [p.intensity for p in shown] or [1.0]
    ys = [p.flops_per_s / units.TERA for p in shown] or [roof / units.TERA]
    ax.set_xlim(min(xs) / 3, max(max(xs), roof / device.memory_bandwidth) * 3)
    ax.set_ylim(min(ys) / 3, roof / units.TERA * 3)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved (TFLOP/s)")
    ax.grid(True, which="major", alpha=0.3)
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], ls="", marker="o", ms=7, alpha=0.6,
                       color=colors.get(g, OTHER_COLOR), label=g) for g in groups]
    handles += [Line2D([], [], ls="", marker=f"${rank}$", color="black",
                       label=p.label(p.seconds / total_s))
                for rank, p in enumerate(leaders, 1)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              frameon=False, title="marker area: share of device time", title_fontsize=8)
    placed_s = sum(p.seconds for p in shown)
    left_out = sum(times for _, times in weighted) - sum(p.count for p in shown)
    ax.set_title(f"{title or device.full_name}\n{sum(p.count for p in shown)} kernels "
                 f"({placed_s / total_s:.0%} of device time) in {len(shown)} markers; "
                 f"{left_out} without FLOPs or below {FLOOR:g} of the peak not drawn",
                 fontsize=10)
    return fig
