"""The plots of a training estimate (timeline, memory, scaling, roofline), the scaling rows
behind one of them, and the CLI flags that write them."""

from __future__ import annotations

import doctest
import json
import re
from pathlib import Path

import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

import gpusim.explore.scaling
from gpusim import units
from gpusim.cli import main
from gpusim.errors import InvalidConfig
from gpusim.estimate import estimate, resolve_model
from gpusim.explore.scaling import ScalingRow, scaling
from gpusim.hardware.catalog import load_device
from gpusim.hardware.profile import DeviceProfile
from gpusim.plan.job import TrainingJob
from gpusim.plan.lower import lower
from gpusim.plan.memory import ALLOCATOR_SLACK
from gpusim.plotting.memory import memory_figure
from gpusim.plotting.roofline import roofline_figure
from gpusim.plotting.scaling import scaling_figure
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
    path = tmp_path / "figure.png"
    fig.savefig(path, dpi=60)
    assert path.read_bytes()[:8] == PNG


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
    usable = units.to_gib(h100.memory_bytes * (1 - ALLOCATOR_SLACK))
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
    assert "GPUs  batch (samples)   step (ms)    samples/s       tokens/s  efficiency (%)" in out
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
