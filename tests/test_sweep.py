"""What-if sweeps: value syntax, names, per-point answers, resuming, executors, CLI, plots."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpusim.cli import sweep as sweep_command
from gpusim.errors import InvalidConfig, MissingDependency
from gpusim.estimation import estimate
from gpusim.explore import sweep as sweep_module
from gpusim.explore.sweep import METRICS, SweepResult, sweep
from gpusim.explore.values import parse_values, with_fields
from gpusim.hardware.catalog import load_device

BASE = {"model": "mnist-mlp", "gpu": "h100-sxm", "precision": "bf16"}
VARY: dict[str, list[Any]] = {"batch_size": [32, 64, 128], "optimizer": ["adam", "sgd"]}


# --- values ------------------------------------------------------------------------------

@pytest.mark.parametrize(("spec", "expected"), [
    ("1000:4000:7", [1000, 1500, 2000, 2500, 3000, 3500, 4000]),
    ("32:512:5:log", [32, 64, 128, 256, 512]),
    ("1:2:3", [1.0, 1.5, 2.0]),
    ("0:1:4", [0.0, 0.333333333333, 0.666666666667, 1.0]),
    ("1:100:3:log", [1, 10, 100]),
    ("1:10:3:log", [1.0, 3.16227766017, 10.0]),
    ("5:5:1", [5]),
    ("fp16,bf16,8,2.5,1e9", ["fp16", "bf16", 8, 2.5, 1e9]),
    ("my-model.yaml", ["my-model.yaml"]),
])
def test_value_syntax(spec: str, expected: list[Any]) -> None:
    values = parse_values(spec)
    assert values == expected
    assert [type(v) for v in values] == [type(v) for v in expected]  # ints stay ints


@pytest.mark.parametrize(("spec", "message"), [
    ("1:10", "START:STOP:COUNT"), ("1:10:0", "COUNT must be 1 or more"),
    ("0:10:3:log", "above 0"), ("1:10:3:lin", "START:STOP:COUNT"), ("a,,b", "empty value"),
    ("8,16,8", "more than once"), ("1:2:100000000", "100,000,000 values is more than any"),
])
def test_bad_value_syntax(spec: str, message: str) -> None:
    with pytest.raises(InvalidConfig, match=message):
        parse_values(spec)


@pytest.mark.parametrize(("vary", "message"), [
    ({"bach_size": [1]}, r"unknown field 'bach_size' \(did you mean batch_size"),
    ({"gpu.memory_bandwith_gb_s": [1]}, "did you mean gpu.memory_bandwidth_gb_s"),
    ({"gpu.matrix_tflops": [1]}, "name one entry, e.g. gpu.matrix_tflops.bf16"),
    ({"precision": ["bf61"]}, "precision='bf61': Input should be 'fp32'"),
    ({"batch_size": [2.5]}, "batch_size=2.5"),
    ({"gpu.memory_gib": ["lots"]}, "takes numbers"),
    ({"gpu.memory_gib": [-1]}, "greater than 0"),
    ({"batch_size": [8, 8]}, "given twice"),
    ({}, "nothing to vary"),
    ({"batch_size": list(range(1, 201)), "seq_len": list(range(1, 101))},
     "the grid has 20,000 points, more than the 10,000"),
])
def test_bad_sweeps_fail_before_any_point_runs(vary: dict[str, list[Any]], message: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep_module, "run_point", _forbidden)
    with pytest.raises(InvalidConfig, match=message):
        sweep({**BASE, "batch_size": 64}, vary, workers=1)


def test_required_keywords_are_named() -> None:
    with pytest.raises(InvalidConfig, match="a sweep needs gpu"):
        sweep({"model": "mnist-mlp"}, {"batch_size": [32]}, workers=1)


def _forbidden(settings: dict[str, Any]) -> dict[str, Any]:
    raise AssertionError(f"ran {settings}")


# --- answers -----------------------------------------------------------------------------

def test_rows_are_the_estimates_in_grid_order() -> None:
    result = sweep(BASE, VARY, workers=1)
    assert result.fields == ("batch_size", "optimizer")
    assert [(r["batch_size"], r["optimizer"]) for r in result.rows] == [
        (32, "adam"), (32, "sgd"), (64, "adam"), (64, "sgd"), (128, "adam"), (128, "sgd")]
    for row in result.rows:
        assert list(row) == [*VARY, *METRICS]
        direct = estimate("mnist-mlp", "h100-sxm", row["batch_size"], precision="bf16",
                          optimizer=row["optimizer"])
        assert row["step_time_s"] == direct.step.step_time_s
        assert row["samples_per_s"] == direct.step.samples_per_s
        assert row["cost_usd"] == direct.cost_usd
        assert row["energy_kwh"] == direct.energy_kwh
        assert row["mfu"] == direct.step.mfu
        assert row["fits"] is True and row["error"] is None
    assert result.infeasible == 0


def test_profile_fields_are_what_if_hardware() -> None:
    base = {"model": "resnet50", "gpu": "h100-sxm", "batch_size": 32, "precision": "bf16",
            "loader_workers": 0}
    bandwidths = [500, 1000, 2000, 4000]
    result = sweep(base, {"gpu.memory_bandwidth_gb_s": bandwidths}, workers=1)
    times = result.column("step_time_s")
    assert times == sorted(times, reverse=True) and times[0] > 1.5 * times[-1]
    h100 = load_device("h100-sxm")
    slow = with_fields(h100, {"memory_bandwidth_gb_s": 500})
    assert slow.memory_bandwidth_gb_s == 500 and slow.name == h100.name
    assert times[0] == estimate("resnet50", slow, 32, precision="bf16",
                                loader_workers=0).step.step_time_s
    table = sweep(base, {"gpu.matrix_tflops.bf16": [100, 989.4]}, workers=1)
    assert table.rows[0]["step_time_s"] > table.rows[1]["step_time_s"]


def test_infeasible_points_are_answers() -> None:
    base = {"model": "gpt2", "gpu": "a100-80gb", "batch_size": 8, "seq_len": 128}
    vary: dict[str, list[Any]] = {"precision": ["bf16", "fp8"], "gpu.memory_gib": [1, 80],
                                  "grad_accum": [1, 3]}
    rows = {(r["precision"], r["gpu.memory_gib"], r["grad_accum"]): r
            for r in sweep(base, vary, workers=1).rows}
    assert rows["bf16", 80, 1]["fits"] and rows["bf16", 80, 1]["step_time_s"] > 0
    oom = rows["bf16", 1, 1]
    assert not oom["fits"] and oom["error"].startswith("OutOfMemory: ")
    assert oom["peak_memory_bytes"] > 2**30 and oom["step_time_s"] is None
    # the same measure whether it fits: the allocated peak, not the peak plus the CUDA context
    assert oom["peak_memory_bytes"] == rows["bf16", 80, 1]["peak_memory_bytes"]
    assert "\n" not in oom["error"]
    assert rows["fp8", 80, 1]["error"].startswith("UnsupportedPrecision: ")
    assert rows["bf16", 80, 3]["error"].startswith("InvalidConfig: batch size 8 is not "
                                                   "divisible")
    assert sum(not r["fits"] for r in rows.values()) == 7


def test_new_estimate_keywords_are_sweepable(monkeypatch: pytest.MonkeyPatch) -> None:
    # A keyword estimate() does not have today, found by inspecting the function.
    def grown(model: str, gpu: str, batch_size: int, *, precision: str = "fp32",
              replicas: int = 1) -> Any:
        return estimate(model, gpu, batch_size * replicas, precision=precision)  # type: ignore[arg-type]

    monkeypatch.setattr(sweep_module, "estimate", grown)
    result = sweep({**BASE, "batch_size": 32}, {"replicas": ["1", "2"]}, workers=1)
    doubled = estimate("mnist-mlp", "h100-sxm", 64, precision="bf16")
    assert result.rows[1]["step_time_s"] == doubled.step.step_time_s


# --- results file and resuming -----------------------------------------------------------

class Counting:
    """run_point that counts (and may interrupt) the points it runs."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.seen: list[tuple[Any, Any]] = []
        self.stop_after = stop_after

    def __call__(self, settings: dict[str, Any]) -> dict[str, Any]:
        if self.stop_after is not None and len(self.seen) == self.stop_after:
            raise KeyboardInterrupt
        self.seen.append((settings.get("batch_size"), settings.get("optimizer")))
        return RUN_POINT(settings)


RUN_POINT = sweep_module.run_point


@pytest.mark.parametrize("suffix", [".csv", ".json", ".jsonl"])
def test_resume_skips_finished_points(suffix: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = sweep(BASE, VARY, out=tmp_path / f"fresh{suffix}", workers=1)
    expected = (tmp_path / f"fresh{suffix}").read_bytes()
    out = tmp_path / f"sweep{suffix}"
    first = Counting(stop_after=2)
    monkeypatch.setattr(sweep_module, "run_point", first)
    with pytest.raises(KeyboardInterrupt):
        sweep(BASE, VARY, out=out, workers=1)
    journal = out if suffix != ".json" else tmp_path / f"sweep{suffix}.partial"
    assert not (suffix == ".json" and out.exists())
    lines = journal.read_text().splitlines()
    assert len(lines) == 2 + (suffix == ".csv")  # both finished points, nothing else
    with journal.open("a") as f:  # a point cut off mid-line, as a kill can leave it
        f.write(lines[-1][:25])

    second = Counting()
    monkeypatch.setattr(sweep_module, "run_point", second)
    calls: list[tuple[int, int]] = []
    result = sweep(BASE, VARY, out=out, workers=1, progress=lambda d, t: calls.append((d, t)))
    assert calls[0] == (2, 6) and calls[-1] == (6, 6)
    assert result.resumed == 2
    assert second.seen == [(64, "adam"), (64, "sgd"), (128, "adam"), (128, "sgd")]
    assert result.rows == fresh.rows
    assert out.read_bytes() == expected
    assert not (tmp_path / f"sweep{suffix}.partial").exists() or suffix != ".json"

    third = Counting()
    monkeypatch.setattr(sweep_module, "run_point", third)
    again = sweep(BASE, VARY, out=out, workers=1)
    assert third.seen == [] and again.resumed == 6 and again.rows == fresh.rows


def test_results_file_formats(tmp_path: Path) -> None:
    sweep(BASE, VARY, out=tmp_path / "s.csv", workers=1)
    sweep(BASE, VARY, out=tmp_path / "s.json", workers=1)
    with (tmp_path / "s.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == [*VARY, *METRICS] and len(rows) == 6
    assert rows[0]["fits"] == "True" and rows[0]["error"] == ""
    data = json.loads((tmp_path / "s.json").read_text())
    assert [r["batch_size"] for r in data] == [32, 32, 64, 64, 128, 128]
    assert float(rows[3]["step_time_s"]) == data[3]["step_time_s"]
    assert not (tmp_path / "s.json.partial").exists()
    with pytest.raises(InvalidConfig, match=r"\.csv, \.json or \.jsonl"):
        sweep(BASE, VARY, out=tmp_path / "s.txt", workers=1)


def test_a_file_of_another_sweep_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "s.csv"
    sweep(BASE, {"batch_size": [32]}, out=out, workers=1)
    with pytest.raises(InvalidConfig, match="another sweep's results"):
        sweep(BASE, {"precision": ["bf16"], "batch_size": [32]}, out=out, workers=1)


def test_points_outside_the_new_grid_stay_in_the_file(tmp_path: Path) -> None:
    out = tmp_path / "s.csv"
    sweep(BASE, {"batch_size": [32, 64]}, out=out, workers=1)
    result = sweep(BASE, {"batch_size": [64, 128]}, out=out, workers=1)
    assert result.resumed == 1 and [r["batch_size"] for r in result.rows] == [64, 128]
    assert [r[0] for r in csv.reader(out.open())][1:] == ["64", "128", "32"]


# --- executors ---------------------------------------------------------------------------

def test_process_pool_gives_the_same_bytes(tmp_path: Path) -> None:
    one = sweep(BASE, VARY, out=tmp_path / "one.csv", workers=1)
    two = sweep(BASE, VARY, out=tmp_path / "two.csv", workers=2)
    assert one.rows == two.rows
    assert (tmp_path / "one.csv").read_bytes() == (tmp_path / "two.csv").read_bytes()


def test_dask_cluster() -> None:
    distributed = pytest.importorskip("dask.distributed")
    local = sweep(BASE, VARY, workers=1)
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2,
                                  dashboard_address=None) as cluster:
        result = sweep(BASE, VARY, executor="dask", scheduler=cluster.scheduler_address)
    assert result.rows == local.rows


def test_dask_needs_its_package_and_a_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # as if not installed
    with pytest.raises(MissingDependency, match=r"pip install 'dask\[distributed\]'"):
        sweep(BASE, VARY, executor="dask", scheduler="tcp://127.0.0.1:8786")
    monkeypatch.setitem(sys.modules, "dask.distributed", types.ModuleType("dask.distributed"))
    with pytest.raises(InvalidConfig, match="--scheduler ADDRESS"):
        sweep(BASE, VARY, executor="dask")


def test_ray_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    # Ray is heavy to install; a stand-in with its API (init, remote, wait, get) runs tasks
    # in reverse order to show rows land at their points whatever order they finish in.
    fake = types.ModuleType("ray")
    inits: list[str] = []

    class Remote:
        def __init__(self, fn: Any) -> None:
            self.fn = fn

        def remote(self, settings: dict[str, Any]) -> object:
            ref = object()
            results[ref] = self.fn(settings)
            return ref

    results: dict[object, Any] = {}
    fake.init = lambda address, ignore_reinit_error: inits.append(address)  # type: ignore[attr-defined]
    fake.remote = Remote  # type: ignore[attr-defined]
    fake.wait = lambda refs, num_returns: (refs[-1:], refs[:-1])  # type: ignore[attr-defined]
    fake.get = results.__getitem__  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", fake)
    result = sweep(BASE, VARY, executor="ray")
    assert inits == ["auto"]
    assert result.rows == sweep(BASE, VARY, workers=1).rows


# --- command line ------------------------------------------------------------------------

def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpusim")
    sweep_command.add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return sweep_command.HANDLERS[args.command](args)


def test_sweep_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        _cli(["sweep", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "usage: gpusim sweep" in out and "START:STOP:COUNT" in out and "--executor" in out


def test_sweep_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, plot = tmp_path / "s.csv", tmp_path / "s.png"
    argv = ["sweep", "--model", "mnist-mlp", "--gpu", "h100-sxm", "--precision", "bf16",
            "--vary", "batch-size=32:128:3:log", "--vary", "gpu.memory_gib=0.5,80",
            "--set", "loader_workers=0", "--workers", "1", "--out", str(out),
            "--plot", str(plot), "--metric", "samples_per_s"]
    assert _cli(argv) == 0
    printed = capsys.readouterr()
    assert printed.out.split()[:5] == ["batch_size", "gpu.memory_gib", "samples_per_s", "fits",
                                       "error"]
    assert "OutOfMemory" in printed.out
    assert "best samples_per_s:" in printed.out and "gpu.memory_gib=80" in printed.out
    assert "sweep: 6 points (6 run, 0 resumed, 3 do not run)" in printed.err
    assert plot.read_bytes()[:4] == b"\x89PNG"
    rows = list(csv.DictReader(out.open()))
    assert [r["batch_size"] for r in rows] == ["32", "32", "64", "64", "128", "128"]
    assert _cli(argv) == 0
    assert "resuming: 6 of 6 points already done" in capsys.readouterr().out


def test_progress_bar_on_a_terminal_and_interrupts(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    out = tmp_path / "s.jsonl"
    argv = ["sweep", "--model", "mnist-mlp", "--gpu", "h100", "--batch-size", "32",
            "--vary", "optimizer=adam,sgd,adamw", "--workers", "1", "--out", str(out)]
    monkeypatch.setattr(sweep_module, "run_point", Counting(stop_after=1))
    assert _cli(argv) == 130
    assert "sweep interrupted; finished points are in" in terminal.getvalue()
    assert len(out.read_text().splitlines()) == 1
    monkeypatch.setattr(sweep_module, "run_point", RUN_POINT)
    assert _cli(argv) == 0
    bar = terminal.getvalue()
    assert "\x1b[" in bar  # drawn in place, with the terminal's control codes
    assert "3/3" in bar and "points" in bar and "left" in bar
    assert "sweep: 3 points (2 run, 1 resumed, 0 do not run)" in bar
    assert "resuming: 1 of 3 points already done" in capsys.readouterr().out


def test_sweep_command_errors() -> None:
    with pytest.raises(InvalidConfig, match="NAME=VALUES"):
        _cli(["sweep", "--model", "mnist-mlp", "--gpu", "h100", "--vary", "batch_size"])
    with pytest.raises(InvalidConfig, match="did you mean batch_size"):
        _cli(["sweep", "--model", "mnist-mlp", "--gpu", "h100", "--vary", "batchsize=1,2"])
    with pytest.raises(InvalidConfig, match="twice"):
        _cli(["sweep", "--model", "mnist-mlp", "--gpu", "h100", "--vary", "batch_size=1",
              "--vary", "batch_size=2"])


# --- plots -------------------------------------------------------------------------------

def _result(fields: tuple[str, ...], points: list[tuple[Any, ...]],
            times: list[float | None]) -> SweepResult:
    rows = []
    for point, t in zip(points, times, strict=True):
        row: dict[str, Any] = dict(zip(fields, point, strict=True))
        row.update(dict.fromkeys(METRICS), step_time_s=t, fits=t is not None)
        rows.append(row)
    return SweepResult(fields, tuple(rows))


def test_line_plot_one_line_per_other_value() -> None:
    from gpusim.plotting.sweep import sweep_figure

    points = [(bw, p) for bw in (1000, 2000, 3000) for p in ("fp16", "bf16")]
    times = [3.0, 3.1, 2.0, 2.1, 1.0, None]
    ax = sweep_figure(_result(("bw", "precision"), points, times)).axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"precision=fp16", "precision=bf16"}
    assert list(lines["precision=fp16"].get_xdata()) == [1000, 2000, 3000]
    assert list(lines["precision=fp16"].get_ydata()) == [3.0, 2.0, 1.0]
    assert np.isnan(lines["precision=bf16"].get_ydata()[-1])  # does not fit: a gap
    assert ax.get_xlabel() == "bw" and "1 of 6 points do not run" in ax.get_title()


def test_heatmap_over_two_numeric_fields() -> None:
    from gpusim.plotting.sweep import sweep_figure

    points = [(b, m) for b in (32, 64) for m in (40, 80, 120)]
    times = [1.0, 1.1, 1.2, None, 2.1, 2.2]
    fig = sweep_figure(_result(("batch", "mem"), points, times))
    image = fig.axes[0].get_images()[0].get_array()
    assert image.shape == (3, 2)  # rows: mem, columns: batch
    assert image[0, 0] == 1.0 and image[2, 1] == 2.2
    assert bool(np.ma.getmaskarray(image)[0, 1])  # (64, 40) does not fit: a grey cell


def test_bars_when_nothing_varied_is_a_number() -> None:
    from gpusim.plotting.sweep import sweep_figure

    fig = sweep_figure(_result(("precision",), [("fp16",), ("bf16",)], [1.0, 2.0]))
    assert [p.get_height() for p in fig.axes[0].patches] == [1.0, 2.0]
    with pytest.raises(InvalidConfig, match="cannot plot 'fits'"):
        sweep_figure(_result(("precision",), [("fp16",)], [1.0]), "fits")


def test_max_points_raises_the_grid_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    vary = {"batch_size": [16, 32, 64]}
    with pytest.raises(InvalidConfig, match="more than the 2 a sweep runs"):
        sweep(BASE, vary, workers=1, max_points=2)
    assert len(sweep(BASE, vary, workers=1, max_points=3).rows) == 3


def test_a_second_sweep_on_the_same_results_file_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "sweep.csv"
    holder = sweep_module.ResultsFile(out, ["batch_size", *METRICS])
    holder.lock()
    try:
        with pytest.raises(InvalidConfig, match="another sweep is writing"):
            sweep(BASE, {"batch_size": [16, 32]}, out=out, workers=1)
    finally:
        holder.unlock()
    assert len(sweep(BASE, {"batch_size": [16, 32]}, out=out, workers=1).rows) == 2
    assert not out.with_name("sweep.csv.lock").exists()


def _children(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_pool_workers_exit_when_the_sweep_is_killed(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import time

    script = ("from gpusim.explore.sweep import sweep\n"
              "sweep({'model': 'resnet50', 'gpu': 'h100-sxm', 'precision': 'bf16'},\n"
              "      {'batch_size': list(range(8, 4008, 8))}, workers=2)\n")
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        workers: set[int] = set()
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            workers = _children(parent.pid)
        assert len(workers) >= 2, "the pool never started"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10 * sweep_module.PARENT_POLL_S + 5
        while time.monotonic() < deadline and any(Path(f"/proc/{w}").exists() and
                                                  "Z" not in _state(w) for w in workers):
            time.sleep(0.2)
        assert not [w for w in workers if Path(f"/proc/{w}").exists() and "Z" not in _state(w)]
    finally:
        if parent.poll() is None:
            parent.kill()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


# Jobs that between them use every profile field the model reads.
FIELD_JOBS: list[dict[str, Any]] = [
    {"model": "gpt2", "gpu": "h100-sxm", "batch_size": 8, "precision": p}
    for p in ("bf16", "fp8", "fp16", "tf32", "fp32")
] + [
    {"model": "mnist-cnn", "gpu": "mi300x", "batch_size": 64, "precision": "fp32"},
    {"model": "mnist-cnn", "gpu": "epyc-9654", "batch_size": 64, "precision": "fp32"},
    {"model": "llama3-8b", "gpu": "h100-sxm", "batch_size": 16, "precision": "bf16",
     "num_gpus": 16, "tp": 8, "seq_len": 2048, "checkpointing": "full"},
    {"model": "llama3-8b", "gpu": "h100-sxm", "batch_size": 1, "precision": "bf16",
     "seq_len": 4096, "pure_bf16": True, "optimizer": "adamw8bit", "checkpointing": "full"},
    # a card whose measured sustained clock sets its compute rate (no power calibration)
    {"model": "gpt2", "gpu": "t4", "batch_size": 8, "precision": "fp16"},
]


def _field_value(job: dict[str, Any], field: str) -> Any:
    value: Any = load_device(job["gpu"])
    if field == "power_limit_w":  # unset means the TDP
        return value.power_limit
    for part in field.split("."):
        value = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
    return value


def test_every_profile_field_a_sweep_takes_changes_a_result_or_says_it_cannot() -> None:
    """A what-if value of a field the model reads changes the estimate of a job that uses
    it; the fields no estimate reads are listed (with why) and really change nothing."""
    from gpusim.explore import values

    for field in values.gpu_fields():
        changed = False
        for job in FIELD_JOBS:
            value = _field_value(job, field)
            if value is None or isinstance(value, bool):
                continue
            base = sweep_module.run_point(dict(job))
            for scale in (0.5, 2.0):
                new = max(1, int(value * scale)) if isinstance(value, int) else value * scale
                if sweep_module.run_point({**job, f"gpu.{field}": new}) != base:
                    changed = True
            if changed:
                break
        assert changed == (field not in values.DESCRIPTIVE), field


def test_a_sweep_says_when_a_field_changed_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    result = sweep(BASE, {"batch_size": [32, 64], "gpu.l2_cache_mib": [25, 50]}, workers=1)
    assert result.inert_fields() == ["gpu.l2_cache_mib"]
