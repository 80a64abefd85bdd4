"""Published training runs under board power limits (measurements/published/power_limits.yaml,
kind training) against gpusim's predictions: each limit's throughput over the sweep's
highest limit's, measured and predicted. Validation, never fitted (the power model is fitted
on clock sweeps by gpusim.calibrate.power).

The sources give throughput per limit but not every setting of the job; the jobs below
state what is assumed. Only the ratios are compared, which depend mostly on how much of a
step is compute-bound.

    python benchmarks/power_limits.py
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

import yaml

from gpusim.data import data_dir
from gpusim.errors import GpusimError
from gpusim.estimation import estimate
from gpusim.hardware.calibration import calibration_for
from gpusim.hardware.catalog import load_gpu

# The workload text of a sweep (its start) -> the job gpusim runs for it, and what that
# assumes beyond the source.
JOBS: dict[str, tuple[dict[str, Any], str]] = {
    "LLaMA 3 8B continued pre-training": (
        {"model": "llama3-8b", "batch_size": 8, "seq_len": 2048, "num_gpus": 4,
         "microbatch_size": 2, "zero": 3, "precision": "bf16", "optimizer": "adamw",
         "checkpointing": "full"},
        "assumed: bf16, sequence 2048, microbatch 2, FSDP over 4 GPUs, full recompute"),
    "ViT-L/16 training": (
        {"model": "vit-l16", "batch_size": 512, "num_gpus": 4, "precision": "bf16",
         "optimizer": "adamw"},
        "assumed: bf16, 128 images per GPU, DDP over 4 GPUs"),
    "resnet50 on imagenet": (
        {"model": "resnet50", "batch_size": 256, "precision": "fp32", "optimizer": "adam"},
        "assumed: fp32 (the trace states no precision), Adam for Adadelta"),
    "bert_base_uncased on squad": (
        {"model": "bert-base", "batch_size": 32, "seq_len": 384, "precision": "fp32",
         "optimizer": "adamw"},
        "assumed: fp32, sequence 384"),
}


def _job(workload: str) -> tuple[dict[str, Any], str] | None:
    return next((job for start, job in JOBS.items() if workload.startswith(start)), None)


def _rate(row: dict[str, Any]) -> float:
    """Throughput, higher is faster (seconds per epoch are inverted)."""
    value = float(row["throughput"])
    return 1 / value if "seconds" in str(row.get("throughput_unit")) else value


def main() -> None:
    path = data_dir("measurements") / "published" / "power_limits.yaml"
    rows = [r for r in yaml.safe_load(path.read_text())["rows"] if r.get("kind") == "training"]
    sweeps: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        sweeps[(r["device"], r["workload"])].append(r)
    errors: dict[str, list[float]] = defaultdict(list)
    for (device, workload), runs in sweeps.items():
        found = _job(workload)
        print(f"\n{device}: {workload[:90]}")
        if found is None:
            print("  no gpusim job written for this workload")
            continue
        kwargs, assumed = found
        print(f"  {assumed}; source: {runs[0]['source']['url']}")
        top = max(runs, key=lambda r: float(r["power_limit_w"]))
        try:
            ref = estimate(gpu=device, power_limit_w=float(top["power_limit_w"]), **kwargs)
        except GpusimError as exc:
            print(f"  not predicted: {exc.summary}")
            continue
        for r in sorted(runs, key=lambda r: float(r["power_limit_w"])):
            measured = _rate(r) / _rate(top)
            try:
                got = estimate(gpu=device, power_limit_w=float(r["power_limit_w"]), **kwargs)
            except GpusimError as exc:
                print(f"  {r['power_limit_w']:>5} W: measured {measured:.3f}, not predicted "
                      f"({exc.summary})")
                continue
            pred = ref.step.step_time_s / got.step.step_time_s
            errors[_group(device)].append(pred / measured - 1)
            print(f"  {r['power_limit_w']:>5} W: measured {measured:.3f} of the top limit's "
                  f"throughput, predicted {pred:.3f} ({pred / measured - 1:+.1%})")
    print()
    for group, errs in sorted(errors.items()):
        print(f"{group}: {len(errs)} limits, mean absolute error "
              f"{statistics.fmean(map(abs, errs)):.1%} in throughput relative to each sweep's "
              f"top limit")


def _group(device: str) -> str:
    gpu = load_gpu(device)
    fitted = calibration_for(gpu).power is not None
    return f"{gpu.architecture} ({'power model fitted' if fitted else 'no power calibration'})"


if __name__ == "__main__":
    main()
