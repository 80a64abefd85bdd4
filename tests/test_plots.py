"""The plots of a training estimate (timeline, memory, scaling, roofline), of a device
comparison and of a sweep, the scaling rows behind one of them, and the CLI flags that write
them. Besides what each plot shows, the tests check what a reader would stumble on: text
outside the figure, labels over each other, raw field names and missing units."""

from __future__ import annotations

import dataclasses
import doctest
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox

import gpusim.explore.scaling
import gpusim.plotting.fields
from gpusim import units
from gpusim.cli import main
from gpusim.errors import InvalidConfig
from gpusim.estimation import estimate, resolve_model
from gpusim.explore.compare import Comparison, compare
from gpusim.explore.scaling import ScalingRow, scaling
from gpusim.explore.sweep import METRICS, SweepResult
from gpusim.hardware.catalog import load_device
from gpusim.hardware.profile import DeviceProfile
from gpusim.plan.job import TrainingJob
from gpusim.plan.lower import lower
from gpusim.plotting.compare import compare_figure, pareto_front, staircase
from gpusim.plotting.memory import memory_figure
from gpusim.plotting.roofline import roofline_figure
from gpusim.plotting.scaling import scaling_figure
from gpusim.plotting.sweep import sweep_figure
from gpusim.plotting.timeline import MAX_STAGES, stage_sample, step_figure
from gpusim.report import TrainingEstimate

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def resnet() -> TrainingEstimate:
    return estimate("resnet50", "h100-sxm", 16, precision="bf16")


@pytest.fixture(scope="module")
def gpt2() -> TrainingEstimate:
    return estimate("gpt2", "h100-sxm", 4, precision="bf16", seq_len=256)


@pytest.fixture(scope="module")
def pipeline() -> TrainingEstimate:
    """8 GPUs: 4 pipeline stages of 2 data-parallel ranks each."""
    return estimate("gpt3-125m", "h100-sxm", 16, precision="bf16", seq_len=256, num_gpus=8,
                    pp=4, microbatch_size=1)


def _saves(fig: Figure, tmp_path: Path) -> None:
    """The figure writes a PNG, and nothing in its layout (titles, tick and axis labels,
    legends, annotations) reaches past its edges."""
    path = tmp_path / "figure.png"
    fig.savefig(path, dpi=60)
    assert path.read_bytes()[:8] == PNG
    drawn = fig.get_tightbbox(_renderer(fig))
    width, height = fig.get_size_inches()
    assert drawn.x0 >= -0.01 and drawn.y0 >= -0.01, drawn
    assert drawn.x1 <= width + 0.01 and drawn.y1 <= height + 0.01, drawn


def _renderer(fig: Figure) -> Any:
    """Draw ``fig`` (layout, ticks and all) on an Agg canvas; its renderer."""
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _overlap(a: Bbox, b: Bbox) -> bool:
    return min(a.x1, b.x1) > max(a.x0, b.x0) and min(a.y1, b.y1) > max(a.y0, b.y0)


def _legend(ax: Axes) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_single_device_timeline(resnet: TrainingEstimate, tmp_path: Path) -> None:
    fig = step_figure(resnet)
    gantt, bar = fig.axes
    assert [t.get_text() for t in gantt.get_yticklabels()] == resnet.step.trace.tracks()
    assert gantt.get_xlabel() == "time since the step started (ms)"
    assert gantt.get_xlim() == pytest.approx((0, resnet.step.step_time_s * 1e3))
    assert {"forward", "backward", "optimizer"} <= set(_legend(gantt))
    parts = [k for k, s in resnet.step.breakdown_s.items() if s > 0]
    assert len(bar.patches) == len(parts)
    assert sum(p.get_width() for p in bar.patches) == pytest.approx(
        resnet.step.step_time_s * 1e3)
    _saves(fig, tmp_path)


def test_pipeline_timeline_groups_rows_by_stage(pipeline: TrainingEstimate,
                                                tmp_path: Path) -> None:
    fig = step_figure(pipeline)
    gantt = fig.axes[0]
    stages = [t.get_text() for t in gantt.get_yticklabels()]
    assert stages == [f"stage {s}\nranks {2 * s}-{2 * s + 1}" for s in range(4)]
    streams = [t.get_text() for t in gantt.get_yticklabels(minor=True)]
    assert streams == ["compute", "p2p", "dp comm"] * 4
    assert {"forward", "backward", "optimizer", "pipeline send/recv",
            "data-parallel comm"} <= set(_legend(gantt))
    assert "8 x NVIDIA H100" in gantt.get_title() and "showing" not in gantt.get_title()
    assert "pipeline bubble" in " ".join(_legend(fig.axes[1]))
    _saves(fig, tmp_path)


def test_deep_pipelines_show_evenly_spaced_stages() -> None:
    assert stage_sample(5) == [0, 1, 2, 3, 4]
    picked = stage_sample(24)
    assert len(picked) == MAX_STAGES and picked[0] == 0 and picked[-1] == 23
    assert picked == sorted(set(picked))
    deep = estimate("gpt3-125m", "h100-sxm", 12, precision="bf16", seq_len=128, num_gpus=12,
                    pp=12, microbatch_size=1)
    gantt = step_figure(deep).axes[0]
    assert f"showing {MAX_STAGES} of 12 stages" in gantt.get_title()
    assert len(gantt.get_yticklabels()) == MAX_STAGES
    assert gantt.get_yticklabels()[-1].get_text() == "stage 11\nrank 11"


def test_stage_names_stand_clear_of_stream_names(pipeline: TrainingEstimate,
                                                tmp_path: Path) -> None:
    """The stage names sit left of the widest stream name, even a per-rank trace's."""
    per_rank = estimate("gpt3-125m", "h100-sxm", 32, precision="bf16", seq_len=128,
                        num_gpus=16, pp=2, microbatch_size=1, per_rank=True)
    for result in (pipeline, per_rank):
        fig = step_figure(result)
        gantt = fig.axes[0]
        renderer = _renderer(fig)
        stages = [t.get_window_extent(renderer) for t in gantt.get_yticklabels()]
        streams = [t.get_window_extent(renderer) for t in gantt.get_yticklabels(minor=True)]
        assert max(b.x1 for b in stages) < min(b.x0 for b in streams)
        _saves(fig, tmp_path)
    assert "dp 7 compute" in [t.get_text() for t in gantt.get_yticklabels(minor=True)]


def _stacked_gib(fig: Figure) -> list[float]:
    """The height of each stacked bar, left to right."""
    totals: dict[float, float] = {}
    for patch in fig.axes[0].patches:
        x = round(patch.get_x() + patch.get_width() / 2, 6)
        totals[x] = totals.get(x, 0.0) + patch.get_height()
    return [totals[x] for x in sorted(totals)]


def test_memory_bars_against_usable_memory(resnet: TrainingEstimate, h100: DeviceProfile,
                                           tmp_path: Path) -> None:
    fig = memory_figure(resnet)
    ax = fig.axes[0]
    breakdown = resnet.step.memory_breakdown_bytes
    assert len(ax.patches) == sum(1 for v in breakdown.values() if v > 0)
    assert _stacked_gib(fig) == pytest.approx([units.to_gib(sum(breakdown.values()))])
    (line,) = ax.collections
    usable = units.to_gib(h100.usable_memory_bytes)
    assert line.get_segments()[0][:, 1] == pytest.approx([usable, usable])
    assert ax.get_ylabel() == "memory (GiB)"
    assert {"weights", "optimizer states", "activations"} <= set(_legend(ax))
    _saves(fig, tmp_path)


def test_memory_one_bar_per_estimate(resnet: TrainingEstimate, gpt2: TrainingEstimate,
                                     pipeline: TrainingEstimate) -> None:
    results = [resnet, gpt2, pipeline]
    fig = memory_figure(results)
    ax = fig.axes[0]
    assert _stacked_gib(fig) == pytest.approx(
        [units.to_gib(sum(r.step.memory_breakdown_bytes.values())) for r in results])
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert len(labels) == 3 and labels[2].startswith("8 x h100-sxm")
    assert ax.get_ylabel() == "memory per GPU (GiB)"


def test_memory_label_of_a_nearly_full_bar_clears_its_limit(tmp_path: Path) -> None:
    full = estimate("gpt2-xl", "h100-sxm", 15, precision="bf16", seq_len=1024)
    half = estimate("gpt2-xl", "h100-sxm", 8, precision="bf16", seq_len=1024)
    fig = memory_figure([full, half])
    ax = fig.axes[0]
    renderer = _renderer(fig)
    (line,) = ax.collections
    limits = [Bbox(ax.transData.transform(segment)) for segment in line.get_segments()]
    labels = [t for t in ax.texts if "GiB" in t.get_text()]
    assert float(labels[0].get_text().split("(")[1].rstrip("%)")) > 90  # nearly full
    for text, limit in zip(labels, limits, strict=True):
        assert not _overlap(text.get_window_extent(renderer), limit.padded(1))
    assert labels[1].xy[1] < labels[0].xy[1]  # a half-full bar keeps its label at its top
    _saves(fig, tmp_path)


def test_weak_scaling_rows() -> None:
    rows = scaling("gpt2", "h100-sxm", [4, 1, 2], batch_size_per_gpu=2, precision="bf16",
                   seq_len=128)
    assert [(r.num_gpus, r.batch_size, r.fits) for r in rows] == [(1, 2, True), (2, 4, True),
                                                                 (4, 8, True)]
    assert rows[0].efficiency == 1.0
    rates = [r.tokens_per_s or 0.0 for r in rows]
    assert rates == sorted(rates) and rates[-1] > 2 * rates[0]
    # Both paths let the GPU wait where the host dispatches more slowly than kernels run,
    # kernel by kernel (the one-GPU engine also overlaps the optimizer's Python with the
    # backward's last kernels): more GPUs are never meaningfully faster per step.
    assert all(0 < (r.efficiency or 0) <= 1.01 for r in rows)
    assert set(rows[0].to_json()) == {"num_gpus", "batch_size", "step_time_s", "samples_per_s",
                                      "tokens_per_s", "efficiency", "fits", "error"}
    assert doctest.testmod(gpusim.explore.scaling).failed == 0


def test_infeasible_points_are_recorded() -> None:
    rows = scaling("gpt2", "h100-sxm", [1, 2, 16], batch_size=4, precision="bf16",
                   seq_len=128, tp=2)
    first = rows[0]
    assert not first.fits and first.samples_per_s is None and first.efficiency is None
    assert "do not split into TP 2" in (first.error or "")
    assert rows[1].fits and rows[1].efficiency == 1.0  # the first count that runs
    assert not rows[2].fits and "does not split over DP 8" in (rows[2].error or "")
    assert {r.batch_size for r in rows} == {4}  # strong scaling


@pytest.mark.parametrize("kwargs, match", [
    ({"batch_size": 8, "batch_size_per_gpu": 1}, "either a batch per GPU"),
    ({}, "either a batch per GPU"),
    ({"batch_size_per_gpu": 0}, "at least 1"),
])
def test_scaling_rejects_bad_batches(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(InvalidConfig, match=match):
        scaling("gpt2", "h100-sxm", [1, 2], **kwargs)


def test_scaling_rejects_repeated_counts() -> None:
    with pytest.raises(InvalidConfig, match="distinct"):
        scaling("gpt2", "h100-sxm", [1, 2, 2], batch_size_per_gpu=1)


def _row(n: int, rate: float | None) -> ScalingRow:
    if rate is None:
        return ScalingRow(n, n, None, None, None, None, False, "does not fit")
    return ScalingRow(n, n, 1.0, rate, None, rate / n / 10.0, True, None)


def test_scaling_figure(tmp_path: Path) -> None:
    rows = [_row(1, 10.0), _row(2, 19.0), _row(4, 30.0), _row(8, None)]
    fig = scaling_figure(rows, "a job")
    left, right = fig.axes
    assert left.get_xscale() == "log" and left.get_ylabel() == "throughput (samples/s)"
    ideal, predicted = left.get_lines()
    assert list(ideal.get_ydata()) == pytest.approx([10, 20, 40, 80])
    assert list(predicted.get_ydata()) == [10.0, 19.0, 30.0]
    assert right.get_ylabel() == "scaling efficiency (%)"
    efficiency = next(line for line in right.get_lines() if line.get_label() == "predicted")
    assert list(efficiency.get_ydata()) == pytest.approx([100, 95, 75])
    assert "does not run" in _legend(right)
    assert [t.get_text() for t in left.get_xticklabels()] == ["1", "2", "4", "8"]
    assert "1 of 4 GPU counts do not run" in fig.texts[0].get_text()
    # Where scaling is ideal the lines coincide: the dashed ideal draws on top.
    assert ideal.get_zorder() > predicted.get_zorder()
    renderer = _renderer(fig)
    for ax in (left, right):  # legends below their panels, clear of the floor's crosses
        assert not _overlap(ax.get_legend().get_window_extent(renderer),
                            ax.get_window_extent(renderer))
    assert not any("$" in t.get_text() for t in left.get_yticklabels())  # 20, not 2x10^1
    _saves(fig, tmp_path)
    with pytest.raises(InvalidConfig, match="no GPU count runs"):
        scaling_figure([_row(1, None)])


def _gpt2_job(h100: DeviceProfile) -> TrainingJob:
    return TrainingJob(resolve_model("gpt2", 256), h100, 4, "bf16", grad_accum=2)


def test_roofline_places_every_kernel_with_flops(h100: DeviceProfile, tmp_path: Path) -> None:
    job = _gpt2_job(h100)
    plan = lower(job)
    fig = roofline_figure(plan, h100, numerics=job.numerics(), title="gpt2")
    ax = fig.axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    assert ax.get_xlabel() == "arithmetic intensity (FLOP/byte)"
    assert ax.get_ylabel() == "achieved (TFLOP/s)"
    legend = _legend(ax)
    assert f"memory bandwidth {h100.memory_bandwidth_gb_s:g} GB/s" in legend
    assert any(t.startswith("matrix bf16 peak") for t in legend)
    assert any(t.startswith("vector bf16 peak") for t in legend)
    assert {"forward", "backward", "optimizer"} <= set(legend)
    assert sum(bool(re.search(r"\(\w+\)( ×\d+)?: \d+%$", t)) for t in legend) == 5
    drawn, markers, left_out = map(int, re.findall(
        r"(\d+) kernels .* in (\d+) markers; (\d+) without", ax.get_title())[0])
    assert drawn + left_out == 2 * len(plan.microbatch) + len(plan.optimizer)  # accum 2
    offsets = [c.get_offsets() for c in ax.collections]
    assert sum(len(o) for o in offsets) == markers < drawn  # repeated blocks merged
    peak, _ = h100.peak_flops("bf16", matrix=True)
    for x, y in (p for o in offsets for p in o):  # never above the roof
        assert y * units.TERA <= min(peak, x * h100.memory_bandwidth) * (1 + 1e-9)
    _saves(fig, tmp_path)


def test_roofline_by_bound_on_a_cpu() -> None:
    cpu = load_device("epyc-9654")
    job = TrainingJob(resolve_model("mnist-cnn"), cpu, 32)
    ax = roofline_figure(lower(job).microbatch, cpu, color_by="bound").axes[0]
    assert {"compute", "memory"} & set(_legend(ax))
    assert cpu.full_name in ax.get_title()


MNIST = ["estimate", "--model", "mnist-cnn", "--gpu", "h100-sxm", "--batch-size", "32"]


def test_estimate_writes_memory_and_roofline_plots(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    memory, roof = tmp_path / "memory.png", tmp_path / "roofline.png"
    assert main([*MNIST, "--memory-plot", str(memory), "--roofline", str(roof)]) == 0
    assert memory.read_bytes()[:8] == PNG and roof.read_bytes()[:8] == PNG
    out = capsys.readouterr().out
    assert f"memory plot written to {memory}" in out and f"roofline written to {roof}" in out


def test_roofline_of_a_multi_gpu_job_is_a_one_line_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    roof = tmp_path / "roofline.png"
    argv = ["estimate", "--model", "gpt3-125m", "--gpu", "h100-sxm", "--batch-size", "8",
            "--seq-len", "128", "--num-gpus", "2", "--roofline", str(roof)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpusim: error: --roofline draws the kernels of a single-device job")
    assert err.count("\n") == 1 and not roof.exists()


def test_scaling_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "scaling.png"
    argv = ["scaling", "--model", "gpt2", "--gpu", "h100-sxm", "--num-gpus", "1,2,4",
            "--batch-size-per-gpu", "2", "--seq-len", "128", "--precision", "bf16", "--tp",
            "2", "--plot", str(plot)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "GPUs" in line).split()
    assert header == ["GPUs", "batch", "(samples)", "step", "(ms)", "samples/s", "tokens/s",
                      "efficiency", "(%)"]
    assert "does not run on 1 GPU: 1 GPUs do not split" in out
    assert plot.read_bytes()[:8] == PNG
    assert main([*argv[:-2], "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["scaling"] == "weak"
    assert [r["fits"] for r in report["rows"]] == [False, True, True]
    assert report["rows"][1]["efficiency"] == 1.0


@pytest.mark.parametrize("argv, message", [
    (["--num-gpus", "1,two", "--batch-size", "8"], "--num-gpus takes comma-separated"),
    (["--num-gpus", "1,2", "--batch-size", "8", "--gpu", "h100-sxn"], "did you mean h100-sxm"),
    (["--num-gpus", "1,2", "--batch-size", "8", "--system", "dgx-h10"], "unknown"),
])
def test_scaling_errors_are_one_line(argv: list[str], message: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    gpu = [] if "--gpu" in argv or "--system" in argv else ["--gpu", "h100-sxm"]
    assert main(["scaling", "--model", "gpt2", *gpu, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpusim: error:") and message in err and err.count("\n") == 1


def test_scaling_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["scaling", "--help"])
    assert done.value.code == 0
    assert "--batch-size-per-gpu" in capsys.readouterr().out


# --- device comparison ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def compared() -> list[Comparison]:
    """One step of GPT-2 on four devices (the l4 has no purchase price, so no cost to own)."""
    return compare("gpt2", ["h100-sxm", "a100-80gb", "l4", "rtx-4090"], batch_size=16)


def _points(collection: Any) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in collection.get_offsets()]


def test_compare_draws_the_pareto_front_its_title_names(compared: list[Comparison],
                                                        tmp_path: Path) -> None:
    fig = compare_figure(compared)
    bars, plane = fig.axes
    assert "dashed: Pareto front" in plane.get_title()
    assert bars.get_xlabel() == "time to train (milliseconds, log scale)"  # a one-step run
    assert plane.get_xlabel() == "time to train (milliseconds)"
    scatters = [c for c in plane.collections if not c.get_label().startswith("_")]
    assert [c.get_label().split(" (")[0] for c in scatters] == ["rent", "own"]
    dashed = [line for line in plane.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == len(scatters)
    for scatter, line in zip(scatters, dashed, strict=True):
        points = _points(scatter)
        front = [points[i] for i in pareto_front(points)]
        steps = list(zip(line.get_xdata(), line.get_ydata(), strict=True))
        assert steps == list(zip(*staircase(front), strict=True))
        assert set(front) <= set(steps)
        beaten = [p for p in points if p not in front]
        assert not set(beaten) & set(steps)
    assert "no price for l4" in _legend(plane)[1]  # why the l4 has no square
    assert any(t.startswith("Pareto front") for t in _legend(plane))
    _saves(fig, tmp_path)


@pytest.mark.parametrize("devices", [1, 8])
def test_compare_labels_stay_inside_and_apart(compared: list[Comparison], devices: int,
                                              tmp_path: Path) -> None:
    """Each point's label (``8 x rtx-4090`` is long) inside the plane and off the others;
    each bar's value inside its panel."""
    rows = [dataclasses.replace(r, num_devices=devices) for r in compared]
    fig = compare_figure(rows)
    bars, plane = fig.axes
    renderer = _renderer(fig)
    labels = [t for t in plane.texts if t.get_text()]
    names = {r.device.name: r.device.name if devices == 1 else f"8 x {r.device.name}"
             for r in rows}
    owned = [n for n in names if n != "l4"]  # a point for renting each, and owning all but one
    assert sorted(t.get_text() for t in labels) == sorted([*names.values(),
                                                           *(names[n] for n in owned)])
    frame = plane.get_window_extent(renderer)
    boxes = [t.get_window_extent(renderer) for t in labels]
    for box in boxes:
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1, box
        assert frame.y0 <= box.y0 and box.y1 <= frame.y1, box
    assert not any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    right = bars.get_window_extent(renderer).x1
    assert all(t.get_window_extent(renderer).x1 <= right for t in bars.texts)
    _saves(fig, tmp_path)


# --- sweeps -----------------------------------------------------------------------------------

def _swept(fields: tuple[str, ...], points: list[tuple[Any, ...]],
           values: dict[str, list[float | None]]) -> SweepResult:
    rows = []
    for i, point in enumerate(points):
        row: dict[str, Any] = dict(zip(fields, point, strict=True))
        row.update(dict.fromkeys(METRICS), **{m: v[i] for m, v in values.items()}, fits=True)
        rows.append(row)
    return SweepResult(fields, tuple(rows))


def _raw(text: str) -> bool:
    """A name as the code spells it rather than as a reader would."""
    return "_" in text or "gpu." in text


def test_sweep_axes_are_words_with_units(tmp_path: Path) -> None:
    assert doctest.testmod(gpusim.plotting.fields).failed == 0
    fields = ("batch_size", "gpu.memory_bandwidth_gb_s")
    points = [(b, bw) for b in (8, 16, 32) for bw in (1000, 2000, 3350)]
    fig = sweep_figure(_swept(fields, points, {"step_time_s": [0.1 * (i + 1) for i in
                                                               range(9)]}))
    heat, colorbar = fig.axes
    assert heat.get_xlabel() == "batch size (samples)"
    assert heat.get_ylabel() == "memory bandwidth (GB/s)"
    assert colorbar.get_ylabel() == "step time (s)"
    assert not any(map(_raw, (heat.get_title(), heat.get_xlabel(), heat.get_ylabel())))
    _saves(fig, tmp_path)
    memory = [20 * units.GIB, 30 * units.GIB]
    fig = sweep_figure(_swept(("gpu.matrix_tflops.bf16",), [(400,), (800,)],
                              {"peak_memory_bytes": memory}), "peak_memory_bytes")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "matrix peak, bf16 (TFLOP/s)"
    assert ax.get_ylabel() == "peak memory (GiB)" and ax.get_title() == "peak memory"
    assert list(ax.get_lines()[0].get_ydata()) == memory  # bytes, as the sweep records them
    _renderer(fig)
    ticks = [float(t.get_text()) for t in ax.get_yticklabels()]  # but ticked in round GiB
    assert len(ticks) >= 3 and all(t == round(t) for t in ticks)
    assert [t * units.GIB for t in ticks] == pytest.approx(list(ax.get_yticks()))
    _saves(fig, tmp_path)
    fig = sweep_figure(_swept(("precision",), [("fp32",), ("bf16",)],
                              {"mfu": [0.2, 0.45]}), "mfu")
    bars = fig.axes[0]
    assert bars.get_xlabel() == "precision" and bars.get_ylabel() == "MFU (% of peak FLOP/s)"
    assert [t.get_text() for t in bars.get_xticklabels()] == ["fp32", "bf16"]
    _renderer(fig)
    assert "40" in [t.get_text() for t in bars.get_yticklabels()]  # percent, not 0.4
    _saves(fig, tmp_path)


def test_sweep_lines_that_coincide_stay_visible(tmp_path: Path) -> None:
    precisions = ("fp32", "fp16", "bf16", "fp8")
    points = [(bw, p) for bw in (1000, 2000, 4000) for p in precisions]
    times = {"fp32": [3.0, 2.0, 1.5], "fp16": [1.5, 1.0, 0.8], "bf16": [1.5, 1.0, 0.8],
             "fp8": [1.504, 1.002, 0.801]}
    step = [times[p][(1000, 2000, 4000).index(bw)] for bw, p in points]
    fig = sweep_figure(_swept(("gpu.memory_bandwidth_gb_s", "precision"), points,
                              {"step_time_s": list(step)}))
    ax = fig.axes[0]
    assert ax.get_xlabel() == "memory bandwidth (GB/s)" and ax.get_ylabel() == "step time (s)"
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == [
        "precision=fp32", "precision=fp16", "precision=bf16 (same as precision=fp16)",
        "precision=fp8 (within 1% of precision=fp16)"]
    assert list(lines[2].get_ydata()) == times["bf16"]  # the data stay as they are
    # Each line its own marker and dashes, later markers smaller and hollow: nested, not hidden.
    assert len({line.get_marker() for line in lines}) == len(lines)
    assert len({str(line.get_linestyle()) for line in lines}) == len(lines)
    sizes = [line.get_markersize() for line in lines]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1]
    assert all(line.get_markerfacecolor() == "none" for line in lines)
    _saves(fig, tmp_path)


def test_sweep_log_axis_ticks_at_the_values_tried() -> None:
    batches = [1, 2, 4, 8, 16, 32]
    fig = sweep_figure(_swept(("batch_size",), [(b,) for b in batches],
                              {"tokens_per_s": [float(b) for b in batches]}), "tokens_per_s")
    ax = fig.axes[0]
    _renderer(fig)
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(b) for b in batches]
    assert ax.get_ylabel() == "throughput (tokens/s)" and np.isfinite(ax.get_ylim()).all()
