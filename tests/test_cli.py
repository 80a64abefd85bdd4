"""The command line, as a user meets it: help, outputs, files, and one-line errors."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpusim.cli import main

ESTIMATE = ["estimate", "--model", "resnet50", "--gpu", "h100-sxm", "--batch-size", "256",
            "--precision", "bf16", "--epochs", "90", "--dataset-size", "1281167"]


@pytest.mark.parametrize("argv", [[], ["estimate"], ["profiles"], ["profiles", "list"],
                                  ["profiles", "show"], ["profiles", "check"], ["models"],
                                  ["models", "list"], ["models", "show"]])
def test_every_subcommand_has_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    assert "usage: gpusim" in capsys.readouterr().out


def test_estimate_prints_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(ESTIMATE) == 0
    out = capsys.readouterr().out
    for word in ("step time", "throughput", "time to train", "GPU-hours", "cost", "energy",
                 "peak memory", "MFU", "forward", "backward", "optimizer", "input pipeline",
                 "host dispatch", "gpu idle"):
        assert word in out


def test_estimate_json_names_its_units(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ESTIMATE, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("step_time_s", "samples_per_s", "tokens_per_s", "time_to_train_s", "gpu_hours",
                "cost_usd", "energy_kwh", "peak_memory_bytes", "mfu", "breakdown_s"):
        assert key in data
    assert data["steps"] == 450411  # ceil(90 x 1281167 / 256)
    assert sum(data["breakdown_s"].values()) == pytest.approx(data["step_time_s"])
    assert data["time_to_train_s"] == pytest.approx(data["steps"] * data["step_time_s"])


def test_language_models_take_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "--model", "gpt2-medium", "--gpu", "h100", "--batch-size", "8",
            "--precision", "bf16", "--tokens", "1e10", "--seq-len", "1024", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tokens_per_s"] == pytest.approx(data["samples_per_s"] * 1024)
    assert data["steps"] == -(-10**10 // (8 * 1024))


def test_transformer_by_dimensions(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "--model", "transformer", "--layers", "4", "--hidden", "1024",
            "--heads", "16", "--kv-heads", "4", "--vocab", "32000", "--seq-len", "512",
            "--gpu", "h100", "--batch-size", "4", "--precision", "bf16", "--steps", "10",
            "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 10


def test_model_from_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text("name: tiny\ninput: {channels: 3, height: 32, width: 32}\nlayers:\n"
                    "  - {type: conv2d, out: 16, kernel: 3, padding: 1}\n"
                    "  - {type: relu}\n  - {type: maxpool, kernel: 2}\n"
                    "  - {type: linear, out: 10}\n  - {type: cross_entropy}\n")
    assert main(["models", "show", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parameters"] == 16 * 3 * 9 + 16 * 16 * 16 * 10 + 10


def test_trace_and_plot_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, plot = tmp_path / "step.json", tmp_path / "step.png"
    assert main([*ESTIMATE, "--trace", str(trace), "--plot", str(plot)]) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"host", "compute", "copy"} <= tracks
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profiles_and_models_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "list", "--json"]) == 0
    names = {row["name"] for row in json.loads(capsys.readouterr().out)}
    assert "h100-sxm" in names
    assert main(["profiles", "show", "H100 SXM5 80GB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["compute_units"] == 132
    assert main(["models", "show", "resnet50", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parameters"] == pytest.approx(25.6e6, rel=0.01)
    assert data["forward_flops_per_sample"] == pytest.approx(8.2e9, rel=0.02)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["estimate", "--model", "resnet50", "--gpu", "h100-sxn", "--batch-size", "8"],
         "did you mean h100-sxm"),
        (["estimate", "--model", "resnet5", "--gpu", "h100", "--batch-size", "8"],
         "unknown model"),
        (["estimate", "--model", "resnet50", "--gpu", "h100", "--batch-size", "8",
          "--tokens", "1e9"], "does not take tokens"),
        (["estimate", "--model", "resnet50", "--gpu", "h100", "--batch-size", "8",
          "--steps", "5", "--epochs", "1", "--dataset-size", "10"], "exactly one"),
        (["estimate", "--model", "resnet50", "--gpu", "h100", "--batch-size", "8",
          "--epochs", "1"], "needs --dataset-size"),
        (["estimate", "--model", "resnet50", "--gpu", "h100", "--batch-size", "8",
          "--layers", "4"], "apply only to --model transformer"),
        (["estimate", "--model", "transformer", "--gpu", "h100", "--batch-size", "8",
          "--layers", "4"], "needs --hidden, --heads"),
        (["estimate", "--model", "gpt3-175b", "--gpu", "h100", "--batch-size", "1",
          "--precision", "bf16"], "needs"),
        (["profiles", "check", "no-such-file.yaml"], "no such file"),
        (["profiles", "show", "nosuchgpu"], "unknown"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_malformed_profile_file_is_reported(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("kind: gpu\nname: bad\nfull_name: Bad\nvendor: x\narchitecture: y\n")
    assert main(["profiles", "check", str(path)]) == 2
    assert "compute_units" in capsys.readouterr().err


def test_installed_entry_point_runs() -> None:
    done = subprocess.run([sys.executable, "-m", "gpusim", "models", "list"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "resnet50" in done.stdout


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    """`gpusim models show gpt3-175b | head -1`: the pipe closes after one line (the
    listing of 96 blocks overflows the pipe's buffer, so the writer sees it)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "gpusim", "models", "show", "gpt3-175b"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # as head does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0
    assert "Traceback" not in err and "BrokenPipe" not in err


@pytest.mark.parametrize("argv", [
    ["estimate", "--model", "gpt2", "--gpu", "h100", "--batch-size", "8", "--epochs", "nan",
     "--dataset-size", "100"],
    ["estimate", "--model", "gpt2", "--gpu", "h100", "--batch-size", "8", "--tokens", "inf"],
    ["estimate", "--model", "gpt2", "--gpu", "h100", "--batch-size", "8", "--tokens", "1e400"],
    ["estimate", "--model", "gpt2", "--gpu", "h100", "--batch-size", "0", "--tokens", "1e9"],
    ["estimate", "--model", "gpt2", "--gpu", "h100", "--batch-size", "-3"],
    ["estimate", "--model", "gpt2", "--gpu", "h100", "--batch-size", "8", "--seq-len", "0"],
    ["estimate", "--model", "gpt2", "--gpu", "h100", "--batch-size", "8", "--seq-len", "-1"],
    ["estimate", "--model", "gpt2", "--gpu", "h100", "--batch-size", "\uff18"],
    ["estimate", "--model", "gpt2", "--gpu", "h100", "--batch-size", "8", "--tokens", "1e300"],
    ["estimate", "--model", "gpt2", "--gpu", "h100", "--num-gpus", "32", "--batch-size", "32",
     "--straggler", "17:nan"],
    ["estimate", "--model", "gpt2", "--gpu", "h100", "--num-gpus", "32", "--batch-size", "32",
     "--straggler", "17:inf"],
    ["compare", "--gpus", "h100-sxm,t4", "--model", "gpt2", "--pue", "inf", "--json"],
    ["compare", "--gpus", "h100-sxm,t4", "--model", "gpt2", "--batch-size", "0"],
    ["compare", "--gpus", "h100-sxm", "--model", "gpt2", "--budget-usd", "nan"],
    ["search", "--model", "gpt2", "--num-gpus", "7", "--batch-size", "0"],
])
def test_bad_numbers_are_one_line_errors(argv: list[str],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Non-finite, zero, negative, huge and non-ASCII numbers (issue 17): exit status 2 and
    a one-line message, never a traceback or a result."""
    with pytest.raises(SystemExit) as exit_info:
        code = main(argv)
        raise SystemExit(code)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out == ""
    errors = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(errors) == 1 and captured.err.rstrip().endswith(errors[0])


def test_json_output_is_valid_json_without_nan() -> None:
    from gpusim import numbers

    text = numbers.dumps({"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": 2.5}})
    assert json.loads(text) == {"a": None, "b": [1.0, None], "c": {"d": 2.5}}


def test_transformer_flags_build_a_true_llama3_8b(capsys: pytest.CaptureFixture[str]) -> None:
    """Gated MLP, RMS norm, rotary positions, an untied head and no biases: the README's
    command builds Llama-3 8B's 8.03B parameters, not a 5.6B GPT-style model."""
    from gpusim.workload import zoo

    argv = ["estimate", "--model", "transformer", "--layers", "32", "--hidden", "4096",
            "--heads", "32", "--kv-heads", "8", "--ffn-hidden", "14336", "--vocab", "128256",
            "--mlp", "swiglu", "--norm", "rmsnorm", "--position", "rope",
            "--no-tie-embeddings", "--no-bias", "--seq-len", "1024", "--gpu", "h100",
            "--batch-size", "1", "--precision", "bf16", "--pure-bf16", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    reference = zoo.get("llama3-8b", seq_len=1024)
    assert data["model_flops_per_step"] == pytest.approx(
        reference.training_flops_per_sample, rel=1e-9)
    assert main(["estimate", "--model", "gpt2", "--gpu", "h100", "--batch-size", "1",
                 "--mlp", "swiglu"]) == 2
    assert "apply only to --model transformer" in capsys.readouterr().err


@pytest.mark.parametrize("flag, path, message", [
    ("--plot", "missing-folder/step.png", "does not exist"),
    ("--plot", ".", "write a .png"),
    ("--trace", "step.txt", "write a .json"),
    ("--memory-plot", "memory.gif", "write a .png"),
])
def test_output_files_are_checked_before_any_work(flag: str, path: str, message: str,
                                                  tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["estimate", "--model", "gpt2", "--gpu", "h100", "--batch-size", "8", flag, path])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("body, message", [
    ("input: {features: 784}\nlayers: [{type: linear, out: 0}]", "at least 1"),
    ("input: {features: 784}\nlayers: [{type: linear, out: -10}]", "at least 1"),
    ("input: {features: 784}\nlayers: [{type: linear, out: .inf}]", "whole number"),
    ("input: {features: 784}\nlayers: [{type: linear, out: 10.7}]", "whole number"),
    ("input: {channels: 3, height: 8, width: 8}\n"
     "layers: [{type: conv2d, out: 4, kernel: 3, stride: 0}]", "stride"),
    ("input: {channels: 3, height: 8, width: 8}\nlayers: [{type: conv2d, out: 4, kernel: 11}]",
     "larger than its input"),
    ("transformer: null", "mapping"),
    ("input: {features: 784}\nlayers: 5", "list of at least one"),
    ("input: {features: 784}\nlayers: []", "list of at least one"),
])
def test_malformed_model_files_name_the_layer(body: str, message: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(f"name: m\n{body}\n")
    assert main(["estimate", "--model", str(path), "--gpu", "h100", "--batch-size", "4"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_cpu_run_counts_cpu_hours(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--model", "mnist-mlp", "--gpu", "epyc-9654", "--batch-size",
                 "64", "--steps", "10"]) == 0
    out = capsys.readouterr().out
    assert "CPU-hours" in out and "GPU-hours" not in out


def test_a_run_is_priced_at_the_users_rate(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "--model", "gpt2", "--gpu", "h100-sxm", "--batch-size", "8",
            "--precision", "bf16", "--steps", "1000", "--json"]
    assert main(argv) == 0
    listed = json.loads(capsys.readouterr().out)
    assert main([*argv, "--usd-per-gpu-hour", "1.00"]) == 0
    mine = json.loads(capsys.readouterr().out)
    assert mine["price_usd_per_hour"] == 1.0 and "--usd-per-gpu-hour" in mine["price_source"]
    assert mine["cost_usd"] == pytest.approx(listed["cost_usd"] / listed["price_usd_per_hour"])


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    from gpusim.cli.app import parser

    action = next(a for a in parser()._actions
                  if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", ["estimate", "memory", "sweep", "search", "compare",
                                     "scaling"])
def test_every_command_defaults_to_the_devices_mixed_precision(command: str) -> None:
    sub = _subparsers()[command]
    assert sub.get_default("precision") == "auto"


@pytest.mark.parametrize(("gpu", "precision"), [("h100-sxm", "bf16"),
                                                ("v100-sxm2-32gb", "fp16"),
                                                ("gtx-1080-ti", "fp32")])
def test_auto_precision_is_said(gpu: str, precision: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--model", "mnist-mlp", "--gpu", gpu, "--batch-size", "64",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["precision"] == precision
    assert any("fastest mixed precision" in a for a in data["assumptions"])


def test_the_command_line_is_one_package() -> None:
    root = Path(__file__).resolve().parents[1]
    assert not list((root / "gpusim").glob("cli*.py"))
    for notebook in (root / "notebooks").glob("*.ipynb"):
        assert "gpusim.cli" not in notebook.read_text(), notebook.name


@pytest.mark.parametrize(("workers", "bound"), [("4", True), ("0", False)])
def test_an_input_bound_step_says_so(workers: str, bound: bool,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--model", "resnet50", "--gpu", "h100-sxm", "--batch-size", "256",
                 "--loader-workers", workers]) == 0
    out = capsys.readouterr().out
    assert ("input-bound" in out) is bound
    if bound:
        assert "--loader-workers" in out.split("input-bound", 1)[1].splitlines()[0]


@pytest.mark.parametrize("argv", [
    ["estimate", "--model", "a" * 300, "--gpu", "h100-sxm", "--batch-size", "8"],
    ["estimate", "--model", "a" * 300 + ":build", "--gpu", "h100-sxm", "--batch-size", "8",
     "--input-shape", "8,4"],
    ["models", "show", "b" * 300],
    ["validate", "--device", ""],
    ["estimate", "--model", "gpt2", "--gpu", "h100-sxm", "--batch-size", "8",
     "--input-shape", "8,4"],
])
def test_names_no_file_system_takes_are_one_line_errors(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A name over 255 bytes made pathlib raise OSError; an empty --device meant every
    device."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpusim: error:") and err.count("\n") == 1


def test_channels_last_drops_the_transposes_around_convolutions(
        capsys: pytest.CaptureFixture[str]) -> None:
    from gpusim.estimation import build_job
    from gpusim.plan.lower import microbatch_ops

    ops = {}
    for last in (False, True):
        job, _ = build_job("resnet50", "h100-sxm", 32, precision="bf16", channels_last=last)
        ops[last] = [op.name for op in microbatch_ops(job)]
    assert any(name.endswith("to_nhwc") for name in ops[False])
    assert not any("nhwc" in name for name in ops[True])
    assert main(["estimate", "--model", "resnet50", "--gpu", "h100-sxm", "--batch-size", "32",
                 "--channels-last", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert any("channels-last (NHWC)" in a for a in data["assumptions"])


def test_a_command_imports_its_own_module_only() -> None:
    """`gpusim estimate` builds the estimate parser alone (the other commands' modules cost a
    third of a second); no command, or a misspelt one, builds them all; the table of
    commands names what each module handles."""
    from gpusim.cli.app import COMMANDS, command_modules

    assert [m.__name__ for m in command_modules(["memory", "--model", "x"])] == \
        ["gpusim.cli.estimate"]
    every = command_modules([])
    assert [m.__name__ for m in every] == [f"gpusim.cli.{name}" for name in COMMANDS]
    assert len(command_modules(["estimat"])) == len(COMMANDS)
    for module, names in zip(every, COMMANDS.values(), strict=True):
        assert tuple(module.HANDLERS) == names
