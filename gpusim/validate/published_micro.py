"""Published microbenchmarks (measurements/published/<device>/micro.json), predicted with
each device's committed calibration: how well the building blocks match figures others
measured, by device and kind of kernel.

A device whose calibration was fitted on the same file is marked in-sample (the fit's own
residual); any other is held out, e.g. the H100's published figures against the fit on this
project's own H100 runs, or the H200's against that same fit.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpusim.calibrate.micro_ops import predict
from gpusim.hardware.calibration import calibration_for
from gpusim.hardware.catalog import load_device
from gpusim.measure import results


@dataclass(frozen=True)
class PublishedGroup:
    device: str
    group: str  # kind of kernel: "gemm bf16", "attention flash forward", "memory", ...
    cases: int
    mean_abs_error: float  # fractions; predicted time over published, minus 1
    mean_signed_error: float
    worst_case: str
    worst_error: float
    in_sample: bool  # the device's calibration was fitted on this file
    calibration: str


def published_files() -> list[Path]:
    return sorted((results.measurements_dir() / "published").glob("*/micro.json"))


def _group(case: dict[str, Any]) -> str:
    kind = str(case["kind"])
    if kind == "gemm":
        return f"gemm {case['precision']}"
    if kind == "sdpa":
        return f"attention {case['backend']} {case['pass'].replace('_', '+')}"
    if kind == "elementwise":
        return "memory bandwidth"
    return kind.replace("_", " ")


def report(path: Path) -> list[PublishedGroup]:
    data = results.load(path, suite="micro")
    device = load_device(data["device"])
    cal = calibration_for(device)
    in_sample = results.display_path(path) in cal.fitted_on
    by_group: dict[str, list[tuple[float, str]]] = {}
    for case in data["cases"]:
        error = predict(case, device, cal) / case["median_s"] - 1
        by_group.setdefault(_group(case), []).append((error, case["id"]))
    out = []
    for group, errors in sorted(by_group.items()):
        worst, worst_id = max(errors, key=lambda e: abs(e[0]))
        out.append(PublishedGroup(
            device.name, group, len(errors), statistics.fmean(abs(e) for e, _ in errors),
            statistics.fmean(e for e, _ in errors), worst_id, worst, in_sample, cal.name))
    return out
