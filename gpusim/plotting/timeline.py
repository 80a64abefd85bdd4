"""The step timeline (one row per track: host, loader, copy engine, compute stream) and the
step breakdown, in one figure."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only; no display is assumed

from matplotlib.figure import Figure

from gpusim.report import TrainingEstimate

PHASE_COLORS = {
    "forward": "#4C72B0", "backward": "#DD8452", "recompute": "#8172B3",
    "optimizer": "#55A868", "input": "#C44E52", "input_pipeline": "#C44E52",
    "dispatch": "#937860", "host_dispatch": "#937860", "sync": "#8C8C8C",
    "gpu_idle": "#CCCCCC",
}


def step_figure(result: TrainingEstimate) -> Figure:
    """A Gantt chart of the last simulated step above a bar of where its time went."""
    step = result.step
    events = step.trace.events
    end = max((e.end_s for e in events), default=0.0)
    start = end - step.step_time_s
    fig = Figure(figsize=(11, 5.5), layout="constrained")
    ax, bar = fig.subplots(2, 1, height_ratios=[3, 1])
    tracks = step.trace.tracks()
    for row, track in enumerate(tracks):
        spans = [(max(e.start_s, start) * 1e3, (e.end_s - max(e.start_s, start)) * 1e3,
                  PHASE_COLORS.get(e.category, "#999999"))
                 for e in events if e.track == track and e.end_s > start]
        if spans:
            ax.broken_barh([(x, w) for x, w, _ in spans], (row - 0.4, 0.8),
                           facecolors=[c for _, _, c in spans], linewidth=0)
    ax.set_yticks(range(len(tracks)), tracks)
    ax.set_xlim(start * 1e3, end * 1e3)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(f"{result.model} on {result.device_name}, batch {result.batch_size}, "
                 f"{result.precision}: one step = {step.step_time_s * 1e3:.2f} ms")
    left = 0.0
    for key, seconds in step.breakdown_s.items():
        if seconds <= 0:
            continue
        ms = seconds * 1e3
        bar.barh(0, ms, left=left, color=PHASE_COLORS.get(key, "#999999"),
                 label=f"{key.replace('_', ' ')} {ms:.2f} ms")
        left += ms
    bar.set_yticks([])
    bar.set_xlabel("step time (ms)")
    bar.legend(loc="upper center", bbox_to_anchor=(0.5, -0.6), ncol=4, frameon=False)
    return fig
