"""The step timeline: a Gantt chart of the last simulated step above a bar of where its time
went.

A single-device trace has host, loader, copy and compute tracks. A multi-GPU trace has, for
each pipeline stage (one representative rank stands for the stage's ranks), a compute stream,
its pipeline sends and its data-parallel communication stream; those rows are grouped by
stage, and past ``MAX_STAGES`` stages an evenly spaced subset (first and last included) is
drawn and the title says so.
"""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")  # files only; no display is assumed

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Patch
from matplotlib.textpath import TextPath

from gpusim import units
from gpusim.report import TrainingEstimate
from gpusim.sim.trace import TraceEvent

# One colour per phase, shared by trace categories and breakdown keys.
PHASE_COLORS = {
    "forward": "#4C72B0", "backward": "#DD8452", "recompute": "#8172B3",
    "optimizer": "#55A868", "input": "#C44E52", "input_pipeline": "#C44E52",
    "dispatch": "#937860", "host_dispatch": "#937860", "sync": "#8C8C8C",
    "tensor_parallel_comm": "#DA8BC3", "context_parallel_comm": "#F1A7D8",
    "expert_parallel_comm": "#B07AA1",
    "pipeline_comm": "#17BECF",
    "data_parallel_comm": "#BCBD22", "comm_slowdown": "#E8E89A", "pipeline_bubble": "#D9D9D9",
    "gpu_idle": "#D9D9D9",
}
OTHER_COLOR = "#999999"
LABELS = {
    "dispatch": "host dispatch", "input": "input (load, copy, wait)",
    "pipeline_comm": "pipeline send/recv", "data_parallel_comm": "data-parallel comm",
    "tensor_parallel_comm": "tensor-parallel comm", "gpu_idle": "GPU idle",
    "context_parallel_comm": "context-parallel comm (K/V gathers)",
    "expert_parallel_comm": "expert-parallel comm (token all-to-alls)",
    "comm_slowdown": "kernels slowed by communication",
}
MAX_STAGES = 8  # more stages than this are sampled evenly; 3 rows each stay legible
STREAMS = ("compute", "p2p", "dp comm")  # display order of a stage's rows
_STAGE_TRACK = re.compile(r"stage (\d+) (.+)")
_REPLICA_STREAM = re.compile(r"dp (\d+) compute")
MAX_REPLICAS = 4  # per-rank traces: replicas drawn per stage, evenly spaced
STREAM_FONT, TICK = 7.0, 2.0  # stream names' font size and their ticks' length, points


def label(key: str) -> str:
    """A phase or breakdown key as a legend reads it."""
    return LABELS.get(key, key.replace("_", " "))


def time_unit(seconds: float) -> tuple[float, str]:
    """(scale, unit) that shows ``seconds`` with a readable number of digits."""
    if seconds >= 2.0:
        return 1.0, "s"
    if seconds >= 2e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def stage_sample(count: int, limit: int = MAX_STAGES) -> list[int]:
    """At most ``limit`` of ``count`` stages, evenly spaced, first and last included."""
    if count <= limit:
        return list(range(count))
    return sorted({round(i * (count - 1) / (limit - 1)) for i in range(limit)})


def _stages(tracks: list[str], events: tuple[TraceEvent, ...] = ()
            ) -> tuple[list[int], list[str], int]:
    """(the stages to draw, the streams of each in display order, stages in all); all
    empty for a trace without stage tracks."""
    stages: dict[int, set[str]] = {}
    for track in tracks:
        if match := _STAGE_TRACK.fullmatch(track):
            stages.setdefault(int(match[1]), set()).add(match[2])
    if not stages:
        return [], [], 0
    present = set().union(*stages.values())
    replicas = sorted({int(m[1]) for t in present if (m := _REPLICA_STREAM.fullmatch(t))})
    if replicas:  # a per-rank trace: the compute stream of a few replicas per stage
        drawn = {replicas[i] for i in stage_sample(len(replicas), MAX_REPLICAS - 1)}
        drawn.add(_busiest_replica(events, replicas[0]))  # a straggler's, if there is one
        count = max(stages) + 1
        streams = [f"dp {r} compute" for r in sorted(drawn)]
        return stage_sample(count, MAX_STAGES // 2), streams, count
    streams = [s for s in STREAMS if s in present] + sorted(present - set(STREAMS))
    count = max(stages) + 1
    return stage_sample(count), streams, count


def _busiest_replica(events: tuple[TraceEvent, ...], default: int) -> int:
    """The data-parallel replica whose compute streams worked longest."""
    busy: dict[int, float] = {}
    for e in events:
        if (m := _STAGE_TRACK.fullmatch(e.track)) and (r := _REPLICA_STREAM.fullmatch(m[2])):
            busy[int(r[1])] = busy.get(int(r[1]), 0.0) + e.duration_s
    return max(busy, key=lambda k: (busy[k], -k)) if busy else default


def _gantt(ax: Axes, events: tuple[TraceEvent, ...], tracks: list[str], start_s: float,
           scale: float) -> set[str]:
    """Draw the events after ``start_s`` on their rows; the categories drawn."""
    row_of = {track: i for i, track in enumerate(tracks)}
    spans: dict[int, list[tuple[float, float, str]]] = {}
    for e in events:
        if e.track in row_of and e.end_s > start_s:
            begin = max(e.start_s, start_s)
            spans.setdefault(row_of[e.track], []).append(
                ((begin - start_s) * scale, (e.end_s - begin) * scale, e.category))
    for row, items in spans.items():
        ax.broken_barh([(x, w) for x, w, _ in items], (row - 0.4, 0.8), linewidth=0,
                       facecolors=[PHASE_COLORS.get(c, OTHER_COLOR) for _, _, c in items])
    return {c for items in spans.values() for _, _, c in items}


def _stage_axis(ax: Axes, shown: list[int], streams: list[str], ranks_per_stage: int) -> None:
    """Streams as minor tick labels, each stage (shaded alternately) as a major one."""
    rows = len(streams)
    names = [f"stage {s}\nranks {s * ranks_per_stage}-{(s + 1) * ranks_per_stage - 1}"
             if ranks_per_stage > 1 else f"stage {s}\nrank {s}" for s in shown]
    for i in range(0, len(shown), 2):
        ax.axhspan(i * rows - 0.5, (i + 1) * rows - 0.5, color="#F2F2F2", zorder=0)
    ax.set_yticks(range(rows * len(shown)), streams * len(shown), minor=True)
    ax.set_yticks([i * rows + (rows - 1) / 2 for i in range(len(shown))], names)
    ax.yaxis.remove_overlapping_locs = False  # a stage's middle stream sits at its centre
    ax.tick_params(axis="y", which="minor", labelsize=STREAM_FONT, length=TICK, pad=TICK)
    # The stage names stand clear of the widest stream name, however long that is.
    widest = max(TextPath((0, 0), s, prop=FontProperties(size=STREAM_FONT)).get_extents().width
                 for s in streams)
    ax.tick_params(axis="y", which="major", labelsize=8, length=0, pad=2 * TICK + widest + 8)


def _title(result: TrainingEstimate, note: str) -> str:
    step = result.step
    scale, unit = time_unit(step.step_time_s)
    where = (f"{result.num_gpus} x {result.device_name} ({step.parallel})"
             if result.num_gpus > 1 else result.device_name)
    return (f"{result.model} on {where}\nbatch {result.batch_size}, {result.precision}: "
            f"one step = {step.step_time_s * scale:.2f} {unit}{note}")


def _breakdown(bar: Axes, breakdown_s: dict[str, float], step_s: float, scale: float,
               unit: str, whose: str) -> None:
    """One bar split by phase, each part's time in the legend."""
    left = 0.0
    for key, seconds in breakdown_s.items():
        if seconds <= 0:
            continue
        width = seconds * scale
        bar.barh(0, width, left=left, color=PHASE_COLORS.get(key, OTHER_COLOR),
                 label=f"{label(key)} {units.human_seconds(seconds)}")
        left += width
    bar.set_xlim(0, step_s * scale)
    bar.set_yticks([])
    bar.set_xlabel(f"step time ({unit}){whose}")
    bar.legend(loc="upper center", bbox_to_anchor=(0.5, -0.5), ncol=4, frameon=False,
               fontsize=8)


def step_figure(result: TrainingEstimate) -> Figure:
    """A Gantt chart of the last simulated step (rows grouped by pipeline stage for multi-GPU
    jobs, coloured by phase and communication kind) above a bar of where its time went."""
    step = result.step
    events = step.trace.events
    end = max((e.end_s for e in events), default=0.0)
    start = end - step.step_time_s
    shown, streams, stages = _stages(step.trace.tracks(), events)
    tracks = ([f"stage {s} {stream}" for s in shown for stream in streams] if shown
              else step.trace.tracks())
    scale, unit = time_unit(step.step_time_s)
    height = min(2.0 + 0.25 * len(tracks), 10.0)
    fig = Figure(figsize=(12, height + 2.2), layout="constrained")
    ax, bar = fig.subplots(2, 1, height_ratios=[height, 1.0])
    drawn = _gantt(ax, events, tracks, start, scale)
    note = ""
    if shown:
        _stage_axis(ax, shown, streams, max(1, result.num_gpus // stages))
        if len(shown) < stages:
            note = f" (showing {len(shown)} of {stages} stages, evenly spaced)"
    else:
        ax.set_yticks(range(len(tracks)), tracks)
    ax.set_ylim(len(tracks) - 0.5, -0.5)  # first track on top
    ax.set_xlim(0, step.step_time_s * scale)
    ax.set_xlabel(f"time since the step started ({unit})")
    ax.set_title(_title(result, note))
    order = [k for k in PHASE_COLORS if k in drawn] + sorted(drawn - set(PHASE_COLORS))
    ax.legend(handles=[Patch(color=PHASE_COLORS.get(k, OTHER_COLOR), label=label(k))
                       for k in order],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    _breakdown(bar, step.breakdown_s, step.step_time_s, scale, unit,
               ", split as the stage that finishes last spent it" if shown else "")
    return fig
