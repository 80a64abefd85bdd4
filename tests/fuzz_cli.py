"""Command lines a careless or curious user might type, and what every outcome must be.

Shared by tests/test_fuzz.py (a bounded number of examples in CI) and benchmarks/fuzz.py
(thousands, with counts per outcome). A run either prints a result that passes sanity
checks, or is a domain error: one line on stderr, exit status 2, no traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from gpusim.cli import main


def _mostly(good: list[str], bad: list[str], weight: int = 6) -> list[str]:
    """Values to draw from: good ones ``weight`` times as likely as bad ones, so most command
    lines get past the parser into the model."""
    return good * weight + bad


MODELS = _mostly(["mnist-mlp", "resnet50", "gpt2", "bert-base", "llama3-8b", "vit-b16",
                  "qwen2.5-0.5b", "mixtral-8x7b", "qwen3-30b-a3b"],
                 ["transformer", "nonexistent-model", "", "gpt2.yaml", "../../etc/passwd"], 2)
GPUS = _mostly(["h100-sxm", "a100-80gb", "rtx-4090", "epyc-9654", "mi300x", "t4", "h100"],
               ["nope", ""], 3)
SMALL = ["1", "2", "4", "8"]
BAD_NUMBERS = ["0", "-1", "nan", "inf", "-inf", "1e400", "2.5", "1e12", "1e13", "1e9", "0x10",
               "", "abc", "1_000"]
NUMBERS = _mostly([*SMALL, "64", "256"], BAD_NUMBERS, 10)
PRECISIONS = _mostly(["fp32", "bf16", "fp16", "tf32", "fp8"], ["int4", ""], 3)

# flag -> values it is tried with (each may also be left out)
FLAGS: dict[str, list[str]] = {
    "--seq-len": _mostly(["128", "512", "2048"], NUMBERS, 4),
    "--grad-accum": _mostly(SMALL, NUMBERS, 2),
    "--num-gpus": _mostly(["2", "8", "16"], NUMBERS, 3),
    "--tp": _mostly(["1", "2", "8"], NUMBERS, 3),
    "--pp": _mostly(["1", "2"], NUMBERS, 3),
    "--cp": _mostly(["1", "2", "4"], NUMBERS, 3),
    "--ep": _mostly(["1", "2", "8"], NUMBERS, 3),
    "--pp-layers": ["16,16", "0,32", "8,8,8,8", "0,8,8,16", "x", "-1,33"],
    "--virtual-stages": _mostly(["1", "2"], NUMBERS, 2),
    "--zero": ["0", "1", "2", "3", "4"],
    "--microbatch-size": _mostly(SMALL, NUMBERS, 2),
    "--steps": _mostly(["1", "100"], NUMBERS, 2),
    "--tokens": _mostly(["1e9", "2e10"], NUMBERS, 10),
    "--epochs": _mostly(["1", "90"], NUMBERS, 2),
    "--dataset-size": _mostly(["60000", "1281167"], NUMBERS, 2),
    "--recompute": ["none", "full", "selective", "per-op", "every-k:2", "every-k:0", "x"],
    "--optimizer": ["adam", "sgd", "adamw8bit", "lion"],
    "--attention": ["auto", "flash2", "cudnn", "math", "flash9"],
    "--stack": ["pytorch", "megatron", "torchtitan-2024", "hf-transformers", "nostack"],
    "--finetune": ["full", "lora", "qlora", "x"],
    "--lora-rank": NUMBERS,
    "--loader-workers": _mostly(["0", "8"], NUMBERS, 4),
    "--offload": ["none", "optimizer", "params", "x"],
    "--straggler": ["1:2", "0:1.5", "17:nan", "17:inf", "x"],
    "--lora-targets": ["q,v", "q,k,v,o,gate,up,down", "x", ""],
}
SWITCHES = ["--pure-bf16", "--max-batch", "--sequence-parallel", "--per-rank",
            "--optimizer-in-backward", "--offload-activations"]


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    command = draw(st.sampled_from(["estimate", "memory"]))
    argv = [command, "--model", draw(st.sampled_from(MODELS)),
            "--gpu", draw(st.sampled_from(GPUS)),
            "--batch-size", draw(st.sampled_from(NUMBERS)),
            "--precision", draw(st.sampled_from(PRECISIONS))]
    for flag in draw(st.lists(st.sampled_from(sorted(FLAGS)), max_size=5, unique=True)):
        argv += [flag, draw(st.sampled_from(FLAGS[flag]))]
    argv += draw(st.lists(st.sampled_from(SWITCHES), max_size=2, unique=True))
    return [*argv, "--json"]


def random_command_line(rng: random.Random) -> list[str]:
    """The same space as ``command_lines``, drawn with a seeded generator (for benchmarks)."""
    argv = [rng.choice(["estimate", "memory"]), "--model", rng.choice(MODELS),
            "--gpu", rng.choice(GPUS), "--batch-size", rng.choice(NUMBERS),
            "--precision", rng.choice(PRECISIONS)]
    for flag in rng.sample(sorted(FLAGS), rng.randint(0, 5)):
        argv += [flag, rng.choice(FLAGS[flag])]
    argv += rng.sample(SWITCHES, rng.randint(0, 2))
    return [*argv, "--json"]


# The commands that explore many jobs at once, on models small enough to search in a fuzz.
SMALL_MODELS = _mostly(["mnist-mlp", "gpt2", "bert-base", "qwen2.5-0.5b"],
                       ["nonexistent-model", "", "resnet50"], 3)
EXPLORE_FLAGS: dict[str, dict[str, list[str]]] = {
    "search": {"--num-gpus": _mostly(["1", "2", "4", "8"], BAD_NUMBERS, 15),
               "--batch-size": _mostly(["8", "16", "64"], BAD_NUMBERS, 15),
               "--seq-len": _mostly(["128", "512"], BAD_NUMBERS, 15),
               "--top": _mostly(["1", "3"], BAD_NUMBERS, 15),
               "--loader-workers": _mostly(["0", "8"], BAD_NUMBERS, 15),
               "--usd-per-gpu-hour": ["2", "0", "-1", "nan", "inf", "x"]},
    "compare": {"--gpus": _mostly(["h100-sxm,a100-80gb", "rtx-4090:4,h100-sxm:2", "t4,epyc-9654",
                                   "all-gpus"],
                                  ["h100-sxm:0", "h100-sxm:x", "nope", "", ",", "h100-sxm:1e9"],
                                  3),
                "--num-gpus": _mostly(["1", "2", "4"], BAD_NUMBERS, 15),
                "--batch-size": _mostly(["16", "64"], BAD_NUMBERS, 15),
                "--steps": _mostly(["1", "100"], BAD_NUMBERS, 15),
                "--seq-len": _mostly(["128", "512"], BAD_NUMBERS, 15),
                "--budget-usd": _mostly(["50000"], ["0", "-5", "nan", "inf", "1e400"], 2),
                "--sort": ["time", "cost", "ownership", "energy", "x"],
                "--pue": _mostly(["1.2"], ["0.5", "nan", "inf", "0"], 2),
                "--usd-per-gpu-hour": ["2", "0", "-1", "nan", "x"]},
    "scaling": {"--num-gpus": _mostly(["1,2", "1,2,4,8"], ["0,2", "x", "", "1,-2", "1e9"], 3),
                "--batch-size-per-gpu": _mostly(["4", "8"], BAD_NUMBERS, 15),
                "--seq-len": _mostly(["128", "512"], BAD_NUMBERS, 15),
                "--tp": _mostly(["1", "2"], BAD_NUMBERS, 15),
                "--zero": ["0", "1", "3", "5"]},
    "sweep": {"--batch-size": _mostly(["8", "32"], BAD_NUMBERS, 15),
              "--vary": _mostly(["batch_size=4,8", "seq_len=128:512:2", "gpu.memory_gib=1,80",
                                 "precision=fp32,bf16", "gpu.memory_bandwidth_gb_s=500:3000:3:log"],
                                ["batch_size", "batch_size=", "nope=1,2", "batch_size=0,-1",
                                 "batch_size=1:2:100000000", "gpu.memory_gib=nan,inf",
                                 "seq_len=x"], 3),
              "--metric": ["step_time_s", "mfu", "tokens_per_s", "x"],
              "--seq-len": _mostly(["128"], BAD_NUMBERS, 15)},
}
REQUIRED = {"search": ["--num-gpus", "--batch-size"], "compare": ["--gpus"],
            "scaling": ["--num-gpus", "--batch-size-per-gpu"], "sweep": ["--vary", "--batch-size"]}


def _explore_argv(pick: Callable[[list[str]], str],
                  some: Callable[[list[str], int], list[str]]) -> list[str]:
    """A sweep, search, compare or scaling command line: ``pick`` one of some values,
    ``some`` of them (distinct, at most so many)."""
    command = pick(sorted(EXPLORE_FLAGS))
    flags = EXPLORE_FLAGS[command]
    argv = [command, "--model", pick(SMALL_MODELS)]
    if command != "compare":
        argv += ["--gpu", pick(GPUS)]
    chosen = [f for f in REQUIRED[command] if pick(["keep"] * 9 + ["leave out"]) == "keep"]
    chosen += some(sorted(set(flags) - set(chosen)), 3)
    for flag in chosen:
        argv += [flag, pick(flags[flag])]
    return [*argv, "--workers", "1"] if command == "sweep" else [*argv, "--json"]


@st.composite
def explore_command_lines(draw: st.DrawFn) -> list[str]:
    return _explore_argv(lambda values: draw(st.sampled_from(values)),
                         lambda values, most: draw(st.lists(st.sampled_from(values),
                                                            max_size=most, unique=True)))


def random_explore_command_line(rng: random.Random) -> list[str]:
    """The same space as ``explore_command_lines``, drawn with a seeded generator."""
    return _explore_argv(rng.choice, lambda values, most: rng.sample(
        values, rng.randint(0, min(most, len(values)))))


@dataclass
class Outcome:
    kind: str  # "result", "error" or a defect: "traceback", "nonsense", "bad error"
    detail: str


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def _sane(command: str, data: dict[str, Any]) -> str:
    """'' when a result makes sense, else what is wrong with it."""
    if not _finite(data):
        return "a number that is not finite"
    if command == "memory":
        peak = data.get("peak_allocated_bytes", data.get("peak_memory_bytes", 1.0))
        return "" if isinstance(peak, (int, float)) and peak > 0 else f"peak {peak!r}"
    step = data["step_time_s"]
    if not step > 0:
        return f"step time {step}"
    parts = sum(data["breakdown_s"].values())
    if not math.isclose(parts, step, rel_tol=0.02, abs_tol=1e-9):
        return f"breakdown sums to {parts}, step is {step}"
    if any(v < -1e-12 for v in data["breakdown_s"].values()):
        return "a negative part of the step"
    mfu = data.get("mfu")
    if mfu is not None and not 0 < mfu <= 1:
        return f"MFU {mfu}"
    if data["steps"] < 1 or data["time_to_train_s"] < 0:
        return "a run of no steps or negative length"
    return ""


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _sane_explore(command: str, data: Any) -> str:
    """'' when an explore command's result makes sense, else what is wrong with it."""
    if not _finite(data):
        return "a number that is not finite"
    if command == "search":
        for row in data["ranked"]:
            if not (_positive(row["step_time_s"]) and 0 < row["mfu"] <= 1
                    and _positive(row["peak_memory_per_gpu_bytes"])):
                return f"search row {row}"
        times = [row["step_time_s"] for row in data["ranked"]]
        return "" if times == sorted(times) else "search rows out of order"
    rows = data["rows"]
    for row in rows:
        if not row["fits"]:
            continue
        figures = ([row["step_time_s"], row["samples_per_s"]] if command == "scaling"
                   else [row["time_to_train_s"], row["samples_per_s"]])
        if not all(_positive(v) for v in figures):
            return f"{command} row {row}"
    return ""


def _sane_sweep(path: str) -> str:
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["fits"] and not _positive(row["step_time_s"]):
            return f"sweep point {row}"
    return ""


def run(argv: list[str]) -> Outcome:
    """Run one command line in-process and classify what happened."""
    out, err = io.StringIO(), io.StringIO()
    with tempfile.TemporaryDirectory() as folder:
        if argv[0] == "sweep":
            argv = [*argv, "--out", f"{folder}/points.jsonl"]
        outcome = _run(argv, out, err)
        if outcome.kind == "result" and argv[0] == "sweep":
            problem = _sane_sweep(f"{folder}/points.jsonl")
            outcome = Outcome("nonsense", problem) if problem else outcome
    return outcome


def _run(argv: list[str], out: io.StringIO, err: io.StringIO) -> Outcome:
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except SystemExit as exc:  # argparse: a usage error
        code = exc.code if isinstance(exc.code, int) else 2
    except TimeoutError:
        raise  # the benchmark's time limit: a hang, not a traceback of gpusim's
    except Exception as exc:  # any escape is the defect being counted
        return Outcome("traceback", f"{type(exc).__name__}: {exc}"[:300])
    if code == 0:
        if argv[0] == "sweep":
            return Outcome("result", "")
        try:
            data = json.loads(out.getvalue())
        except json.JSONDecodeError as exc:
            return Outcome("nonsense", f"not JSON ({exc})")
        problem = (_sane(argv[0], data) if argv[0] in ("estimate", "memory")
                   else _sane_explore(argv[0], data))
        return Outcome("nonsense", problem) if problem else Outcome("result", "")
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    if (code != 2 or len(lines) != 1 or not lines[0].startswith("gpusim")
            or ": error: " not in lines[0]):
        return Outcome("bad error", f"exit {code}: {err.getvalue()[-300:]}")
    return Outcome("error", lines[0])
