"""Where a job's memory goes: one stacked bar per estimate (weights, gradients, optimizer
states, activations, ...) against the memory its device can use."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # files only; no display is assumed

from matplotlib.figure import Figure

from gpusim import units
from gpusim.hardware.catalog import load_device
from gpusim.hardware.profile import DeviceProfile
from gpusim.report import TrainingEstimate

MEMORY_COLORS = {
    "weights": "#4C72B0", "gradients": "#DD8452", "optimizer_states": "#55A868",
    "weight_copies": "#8172B3", "activations": "#C44E52", "transient": "#937860",
    "library_workspaces": "#CCB974", "allocator_stranded": "#B0B0B0",
    "nccl_communicators": "#64B5CD", "framework_reserved": "#8C8C8C",
}
NEAR_FULL = 0.8  # above this share of the usable memory, a bar's label goes above its line


def _bar_label(result: TrainingEstimate) -> str:
    where = (f"{result.num_gpus} x {result.device}\n{result.step.parallel}"
             if result.num_gpus > 1 else result.device)
    return f"{where}\nbatch {result.batch_size}, {result.precision}"


def memory_figure(results: TrainingEstimate | Sequence[TrainingEstimate],
                  devices: Sequence[DeviceProfile] | None = None) -> Figure:
    """A stacked bar (GiB, per GPU: the fullest pipeline stage of a multi-GPU job) of each
    estimate's memory at its peak, with a line at the memory its device can use (what its
    driver gives a process). ``devices`` match ``results`` one to one; by default each is
    looked up in the catalog by its name."""
    results = [results] if isinstance(results, TrainingEstimate) else list(results)
    if devices is None:
        devices = [load_device(r.device) for r in results]
    fig = Figure(figsize=(max(7.5, 1.6 * len(results) + 4.0), 5.5), layout="constrained")
    ax = fig.subplots()
    xs = range(len(results))
    bottoms = [0.0] * len(results)
    keys = list(dict.fromkeys(k for r in results for k in r.step.memory_breakdown_bytes))
    for key in keys:
        gib = [units.to_gib(r.step.memory_breakdown_bytes.get(key, 0.0)) for r in results]
        if any(gib):
            ax.bar(xs, gib, 0.6, bottom=bottoms, label=key.replace("_", " "),
                   color=MEMORY_COLORS.get(key, "#BBBBBB"))
            bottoms = [b + g for b, g in zip(bottoms, gib, strict=True)]
    usable = [units.to_gib(d.usable_memory_bytes) for d in devices]
    ax.hlines(usable, [x - 0.4 for x in xs], [x + 0.4 for x in xs], colors="black",
              linestyles="--", label="usable memory (what the driver gives a process)")
    for x, total, limit in zip(xs, bottoms, usable, strict=True):
        # A bar near its limit has its label above the limit's line, not struck through by it.
        top = limit if total > NEAR_FULL * limit else total
        ax.annotate(f"{total:.1f} of {limit:.1f} GiB\n({total / limit:.0%})", (x, top),
                    xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                    fontsize=8)
    ax.set_xticks(list(xs), [_bar_label(r) for r in results], fontsize=8)
    ax.set_xlim(-0.8, len(results) - 0.2)
    ax.set_ylim(0, 1.2 * max(*bottoms, *usable))
    ax.set_ylabel("memory per GPU (GiB)" if any(r.num_gpus > 1 for r in results)
                  else "memory (GiB)")
    models = ", ".join(dict.fromkeys(r.model for r in results))
    ax.set_title(f"{models}: memory at the step's peak")
    handles, labels = ax.get_legend_handles_labels()  # top of the stack first, as drawn
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0),
              fontsize=8, frameon=False)
    return fig
