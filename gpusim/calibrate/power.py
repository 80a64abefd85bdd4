"""Fit how an architecture's matrix throughput falls under a power limit, from published
power-limit sweeps (measurements/published/power_limits.yaml), and write the fit to
hardware_profiles/calibration/power/<architecture>.yaml.

A sweep is one source's runs of one workload on one device at several limits. A sweep of
GEMM throughput gives a shape: each limit's rate over the highest limit's, against the
model's clock fraction at each limit over its fraction at the highest
(gpusim.hardware.power). Sustained SM clocks give more: each over the boost clock, which
places the demand (the limit above which the clock stops rising) as well. Whole training
runs under limits are validation, never fitted.

    python -m gpusim.calibrate.power [--dry-run]
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from gpusim.data import data_dir
from gpusim.hardware.calibration import calibration_for
from gpusim.hardware.catalog import load_gpu
from gpusim.hardware.power import (
    PowerCalibration,
    clock_fraction,
    on_reference_scale,
    power_file,
)
from gpusim.hardware.profile import DeviceProfile

SWEEPS = Path("published") / "power_limits.yaml"
FITTED_KINDS = ("gemm", "clock")
MATRIX_PRECISIONS = ("bf16", "fp16", "tf32", "fp8", "int8")


@dataclass(frozen=True)
class Point:
    """One limit of one sweep: the rate relative to the sweep's highest limit's (a
    throughput), or to the boost clock (``top_fraction`` None: a sustained clock). Powers
    are fractions of the reference device's TDP, scaled to the die (see
    gpusim.hardware.power); ``idle_scale`` and ``top_idle_scale`` turn a fraction of the
    board's own TDP (its static power) into that scale."""

    sweep: str
    limit_fraction: float  # of the reference TDP
    top_fraction: float | None  # the sweep's highest limit, of the reference TDP
    relative: float
    source: str = ""
    idle_scale: float = 1.0  # a fraction of the board's own TDP, on the reference scale
    top_idle_scale: float = 1.0


def reference_device(device: DeviceProfile) -> str:
    """The device ``device``'s architecture calibration was measured on (its micro file's
    folder), whose TDP the architecture's power fit is a fraction of."""
    cal = calibration_for(device, own=False)
    return Path(cal.fitted_on[0]).parent.name if cal.fitted_on else device.name


def sweeps(rows: list[dict[str, Any]]) -> dict[str, list[Point]]:
    """Per architecture, the points of every sweep of dense matrix work with two or more
    limits (fp64 runs other units, and is left out). A sweep is one source's runs of one
    workload (a row's ``sweep`` names it where devices word it differently) on one die:
    devices of the same compute units and boost clock (an MI300X at 750 W and an MI325X at
    1000 W) are one die at two limits."""
    series: dict[tuple[Any, ...], list[tuple[float, float, float, DeviceProfile]]] = \
        defaultdict(list)
    urls: dict[str, str] = {}
    for row in rows:
        if row.get("kind") not in FITTED_KINDS or row.get("precision") not in MATRIX_PRECISIONS:
            continue
        if not row.get("power_limit_w") or row.get("read_from_chart"):
            continue
        device = load_gpu(row["device"])
        limit, idle_scale = on_reference_scale(device, float(row["power_limit_w"]), 1.0,
                                        reference_device(device))
        die = (device.architecture, device.compute_units, device.boost_clock_mhz)
        for measure in ("tflops", "sm_clock_mhz"):
            if isinstance(row.get(measure), (int, float)):
                title = str(row["source"].get("title"))
                key = (die, title, str(row.get("sweep") or row["workload"]), measure)
                urls[title] = str(row["source"].get("url"))
                series[key].append((limit, idle_scale, float(row[measure]), device))
    points: dict[str, list[Point]] = defaultdict(list)
    for ((arch, *_), title, workload, measure), pts in series.items():
        names = sorted({d.name for *_, d in pts})
        label = f"{'/'.join(names)}: {title}: {workload}: {measure}"
        if len({f for f, *_ in pts}) < 2:
            continue  # one limit: a check (see checks), not a sweep
        if measure == "sm_clock_mhz":
            points[arch] += [Point(label, f, None, min(1.0, clock / d.boost_clock_mhz),
                                   urls[title], scale)
                             for f, scale, clock, d in pts]
        else:
            top, top_scale, top_rate, _ = max(pts, key=lambda p: p[0])
            points[arch] += [Point(label, f, top, rate / top_rate, urls[title], scale,
                                   top_scale)
                             for f, scale, rate, _ in pts]
    return points


def checks(rows: list[dict[str, Any]]) -> dict[str, list[Point]]:
    """Per architecture, sustained clocks of GEMM loops at one limit: not fitted (a loop of
    one dense product draws more than a network's step of mixed kernels, which the fit is
    for), printed beside it. Short bursts after idle are left out."""
    found: dict[str, list[Point]] = defaultdict(list)
    for row in rows:
        if row.get("kind") != "gemm" or row.get("precision") not in MATRIX_PRECISIONS:
            continue
        if row.get("sweep"):  # one limit of a sweep across devices: fitted with it
            continue
        if "burst" in f"{row.get('workload')} {row.get('notes')}".lower():
            continue
        if not isinstance(row.get("sm_clock_mhz"), (int, float)) or not row.get("power_limit_w"):
            continue
        device = load_gpu(row["device"])
        limit, scale = on_reference_scale(device, float(row["power_limit_w"]), 1.0,
                                        reference_device(device))
        found[device.architecture].append(Point(
            f"{device.name}: {row['id']}", limit, None,
            min(1.0, float(row["sm_clock_mhz"]) / device.boost_clock_mhz), idle_scale=scale))
    return found


def _static(idle: float, power: PowerCalibration) -> float:
    return idle if power.static_fraction is None else power.static_fraction


def predicted(p: Point, idle: float, power: PowerCalibration) -> float:
    """A point's rate (or clock) as ``power`` predicts it (``idle``: the architecture's
    idle fraction, the static power where the fit placed none)."""
    static = _static(idle, power)
    at = clock_fraction(p.limit_fraction, static * p.idle_scale, power)
    if p.top_fraction is None:
        return at
    return at / clock_fraction(p.top_fraction, static * p.top_idle_scale, power)


def _errors(points: list[Point], demand: np.ndarray, exponent: np.ndarray,
            static: np.ndarray) -> np.ndarray:
    """Mean absolute log error of every (demand, exponent, static) on the grid at once, the
    arrays broadcast against each other (clock_fraction's formula, vectorised)."""
    def clock(limit: float, idle: np.ndarray) -> np.ndarray:
        head = np.maximum(limit - idle, 1e-3) / np.maximum(demand - idle, 1e-9)
        return np.where(limit >= demand, 1.0, head ** (1.0 / exponent))

    total = np.zeros(np.broadcast_shapes(demand.shape, exponent.shape, static.shape))
    for p in points:
        at = clock(p.limit_fraction, static * p.idle_scale)
        if p.top_fraction is not None:
            at = at / clock(p.top_fraction, static * p.top_idle_scale)
        total += np.abs(np.log(at / p.relative))
    return total / len(points)


# A sweep must span this many limits to place the static power; fewer leave it the idle's.
STATIC_FIT_LIMITS = 4


def fit(architecture: str, points: list[Point], idle: float,
        sources: list[str], measured_device: str | None = None) -> PowerCalibration:
    """The demand, exponent and (where the sweeps span STATIC_FIT_LIMITS limits or more)
    static power that best predict the sweeps' shapes: a grid search over the bounded
    parameters; powers are fractions of ``measured_device``'s TDP."""
    demand = np.arange(60, 301)[:, None, None] / 100  # 0.60 to 3.00 of TDP
    exponent = np.arange(10, 41)[None, :, None] / 10  # 1.0 to 4.0
    spans = len({round(p.limit_fraction, 3) for p in points}) >= STATIC_FIT_LIMITS
    static = (np.arange(0, 36)[None, None, :] / 100 if spans  # 0.00 to 0.35 of TDP
              else np.array([idle])[None, None, :])
    errors = _errors(points, demand, exponent, static)
    # the first best in grid order (demand, then exponent, then static), as a loop would
    i, j, k = np.unravel_index(int(np.argmin(errors)), errors.shape)
    best_err = float(errors[i, j, k])
    best = PowerCalibration(
        name=f"{architecture}-power", architecture=architecture,
        demand_fraction=float(demand[i, 0, 0]), exponent=float(exponent[0, j, 0]),
        static_fraction=float(static[0, 0, k]) if spans else None,
        measured_device=measured_device)
    scale = measured_device or "each device"
    placed = (f"static power {best.static_fraction:.2f} of TDP fitted (the part that does "
              f"not fall with the clock)" if spans else
              f"idle power {idle:.2f} of TDP from the architecture's calibration as the part "
              f"that does not fall with the clock")
    rationale = (f"Fitted by gpusim.calibrate.power on {len(points)} points of "
                 f"{len({p.sweep for p in points})} published sweep(s) (mean error "
                 f"{best_err:.1%}), {placed}. Powers are fractions of the TDP of {scale}, "
                 f"other devices scaled to its die by compute units x boost clock. "
                 f"Efficiencies are taken as measured at the measured device's default limit. "
                 f"Sustained clocks of single-GEMM loops at one limit are checks, not fitted: "
                 f"such a loop draws more than a network's step.")
    return best.model_copy(update={"fitted_on": sources, "rationale": rationale})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweeps", default=None, help=f"default: measurements/{SWEEPS}")
    parser.add_argument("--dry-run", action="store_true", help="show the fit; write nothing")
    args = parser.parse_args(argv)
    path = Path(args.sweeps) if args.sweeps else data_dir("measurements") / SWEEPS
    rows = yaml.safe_load(path.read_text())["rows"]
    for arch, points in sorted(sweeps(rows).items()):
        device = next(d for d in (load_gpu(r["device"]) for r in rows)
                      if d.architecture == arch)
        idle = calibration_for(device).idle_power_fraction
        fitted_sources = {p.source for p in points}
        quoted = [r["id"] for r in rows if str(r.get("notes", "")).startswith("SECOND-HAND")
                  and str(r["source"].get("url")) in fitted_sources]
        power = fit(arch, points, idle, sorted(fitted_sources), reference_device(device))
        if quoted:
            power = power.model_copy(update={"rationale": power.rationale + (
                f" {len(quoted)} of the rows behind it are second-hand (quoted from the paper "
                f"by another project; marked in the sweeps file): to be checked against the "
                f"paper.")})
        print(f"{arch}: demand {power.demand_fraction:.2f} of TDP, exponent "
              f"{power.exponent:.1f}; {power.rationale}")
        for p in points:
            print(f"  {p.sweep[:70]:<70} limit {p.limit_fraction:4.2f} of TDP: measured "
                  f"{p.relative:.3f}, predicted {predicted(p, idle, power):.3f}")
        for p in checks(rows).get(arch, []):
            print(f"  check, not fitted: {p.sweep[:52]:<52} limit {p.limit_fraction:4.2f}: "
                  f"clock {p.relative:.3f} of boost, predicted {predicted(p, idle, power):.3f}")
        if not args.dry_run:
            out = power_file(arch)
            out.parent.mkdir(parents=True, exist_ok=True)
            header = ("# Written by `python -m gpusim.calibrate.power` from the sweeps named "
                      "in fitted_on.\n# Do not edit by hand: add sweeps and re-run it.\n")
            out.write_text(header + yaml.safe_dump(power.model_dump(), sort_keys=False,
                                                   width=100))
            print(f"wrote {out}")


if __name__ == "__main__":
    main()
