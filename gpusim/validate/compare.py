"""``gpusim validate``: predictions against every committed models-suite measurement.

For each device: a row per case (predicted, measured, relative error), the mean absolute
percentage error, p90 and max of the absolute error, per-layer errors, peak-memory error,
and whether the predicted ranking of the cases matches the measured one. Errors are
fractions: (predicted - measured) / measured.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpusim import units
from gpusim.errors import GpusimError, InvalidMeasurement
from gpusim.estimation import simulate_step
from gpusim.hardware.calibration import Calibration, calibration_for
from gpusim.hardware.catalog import catalog
from gpusim.hardware.profile import DeviceProfile
from gpusim.measure import results
from gpusim.plan.job import TrainingJob
from gpusim.plan.lower import Kernel, layer_kind, lower
from gpusim.workload.formats import model_from_spec

# A predicted step in which the device waits on the host for more than this is host-bound.
HOST_BOUND_FRACTION = 0.3


@dataclass(frozen=True)
class LayerRow:
    layer: str
    phase: str  # forward or backward
    predicted_s: float
    measured_s: float
    kind: str = ""  # the layer's kind (linear, attention, rms_norm, ...)

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1


@dataclass
class CaseRow:
    id: str
    model: str
    batch_size: int
    precision: str
    predicted_s: float
    measured_s: float
    predicted_peak_bytes: float | None = None
    measured_peak_bytes: float | None = None
    layers: list[LayerRow] = field(default_factory=list)
    host_fraction: float = 0.0  # of the predicted step, the device waiting on the host
    # Where the suite timed the step's phases (CPUs): phase -> (predicted, measured) seconds,
    # forward with the loss, backward, and the optimizer step.
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def host_bound(self) -> bool:
        """Whether the host sets the pace: then the machine's CPU, not its GPU, decides."""
        return self.host_fraction > HOST_BOUND_FRACTION

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1

    @property
    def memory_error(self) -> float | None:
        if self.measured_peak_bytes and self.predicted_peak_bytes:
            return self.predicted_peak_bytes / self.measured_peak_bytes - 1
        return None


def _stats(errors: list[float]) -> dict[str, float]:
    """MAPE, p90 and max of the absolute errors (fractions); NaN when there are none."""
    if not errors:
        return {"mape": math.nan, "p90_abs_error": math.nan, "max_abs_error": math.nan}
    absolute = sorted(abs(e) for e in errors)
    p90 = absolute[min(len(absolute) - 1, math.ceil(0.9 * len(absolute)) - 1)]
    return {"mape": statistics.fmean(absolute), "p90_abs_error": p90,
            "max_abs_error": absolute[-1]}


def ranking_agreement(pairs: list[tuple[float, float]]) -> float:
    """Fraction of case pairs that prediction and measurement order the same way."""
    agree = total = 0
    for i, (p1, m1) in enumerate(pairs):
        for p2, m2 in pairs[i + 1:]:
            total += 1
            agree += (p1 - p2) * (m1 - m2) > 0
    return agree / total if total else math.nan


@dataclass
class DeviceReport:
    device: str
    source: str
    calibration: str
    rows: list[CaseRow]
    skipped: list[str]

    @property
    def step_stats(self) -> dict[str, float]:
        return _stats([r.error for r in self.rows])

    def step_stats_where(self, host_bound: bool) -> dict[str, float]:
        """Step errors of the cases the prediction calls host-bound (or device-bound)."""
        return _stats([r.error for r in self.rows if r.host_bound == host_bound])

    @property
    def layer_stats(self) -> dict[str, float]:
        return _stats([lay.error for r in self.rows for lay in r.layers])

    def layer_kind_errors(self) -> dict[tuple[str, str], tuple[int, float, float]]:
        """Per (layer kind, phase), over the device-bound cases' layers: how many rows,
        predicted over measured time summed over them minus one, and the seconds the two
        sums differ by (where the GPU model is off, by kind of work)."""
        sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        for row in self.rows:
            if row.host_bound:
                continue
            for lay in row.layers:
                entry = sums[(lay.kind, lay.phase)]
                entry[0] += 1
                entry[1] += lay.predicted_s
                entry[2] += lay.measured_s
        return {key: (int(n), p / m - 1, p - m) for key, (n, p, m) in sums.items() if m > 0}

    def phase_stats(self) -> dict[str, dict[str, float]]:
        """Per phase of the step, where the suite timed them: MAPE and signed mean error."""
        out = {}
        for phase in STEP_PHASES:
            errs = [p / m - 1 for r in self.rows if (pm := r.phases.get(phase))
                    for p, m in [pm] if m > 0]
            if errs:
                out[phase] = {**_stats(errs), "mean_error": statistics.fmean(errs)}
        return out

    @property
    def memory_stats(self) -> dict[str, float]:
        return _stats([e for r in self.rows if (e := r.memory_error) is not None])

    @property
    def worst(self) -> CaseRow | None:
        return max(self.rows, key=lambda r: abs(r.error), default=None)

    def to_dict(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "device": self.device, "source": self.source, "calibration": self.calibration,
            "cases": len(self.rows), **self.step_stats,
            "device_bound": {"cases": sum(not r.host_bound for r in self.rows),
                             **self.step_stats_where(False)},
            "host_bound": {"cases": sum(r.host_bound for r in self.rows),
                           **self.step_stats_where(True)},
            "worst_case": worst.id if worst else None,
            "worst_error": worst.error if worst else None,
            "layer_rows": sum(len(r.layers) for r in self.rows),
            "layer": self.layer_stats, "peak_memory": self.memory_stats,
            "phases": self.phase_stats(),
            "layer_kinds": [{"kind": k, "phase": ph, "rows": n, "error": e, "gap_s": g}
                            for (k, ph), (n, e, g) in sorted(self.layer_kind_errors().items())],
            "ranking_agreement": ranking_agreement(
                [(r.predicted_s, r.measured_s) for r in self.rows]),
            "skipped": self.skipped,
            "rows": [{**{k: v for k, v in asdict(r).items() if k != "layers"},
                      "error": r.error, "memory_error": r.memory_error,
                      "layers": [{**asdict(lay), "error": lay.error} for lay in r.layers]}
                     for r in self.rows],
        }


@dataclass(frozen=True)
class LayerTiming:
    """One layer's phase run alone, as the suites time it: its kernels' (host, device)
    seconds in launch order, and the host time before the first (the backward() call)."""

    kernels: tuple[tuple[float, float], ...]
    lead_s: float = 0.0

    @property
    def host_s(self) -> float:
        return self.lead_s + sum(h for h, _ in self.kernels)

    @property
    def device_s(self) -> float:
        return sum(d for _, d in self.kernels)

    def seconds(self, on_gpu: bool, looped: bool, first_host_s: float = 0.0) -> float:
        """Seconds a timed call takes (``first_host_s`` more host time: the layer's own).
        On a CPU host and kernels take turns. On a GPU a call repeated in a loop runs at
        the pace of the slower side. A call timed alone from an idle GPU (the suites'
        backward: synchronized, then one backward()) cannot start the device before the
        call itself has run (``lead_s``, the autograd engine's start); the rest of the
        host's work overlaps the kernels."""
        if not on_gpu:
            return self.host_s + first_host_s + self.device_s
        host = self.host_s + first_host_s
        if looped:
            return max(host, self.device_s)
        return max(host, self.lead_s + self.device_s)


def isolated_layer_times(job: TrainingJob, cal: Calibration | None = None
                         ) -> dict[tuple[str, str], LayerTiming]:
    """(layer, phase) -> the layer's phase run alone, as the suites time layers: forward
    in a loop, backward as its own backward() call."""
    plan = lower(job, cal)
    by_layer: dict[tuple[str, str], list[Kernel]] = defaultdict(list)
    for k in plan.microbatch:
        by_layer[(k.layer, k.phase)].append(k)
    # The step makes one backward() call, which the plan charges to the first layer of the
    # backward pass; alone, every layer's backward pays it.
    first_backward = next((k.layer for k in plan.microbatch if k.phase == "backward"), "")
    call_s = units.us(plan.calibration.overhead.backward_call_us)
    return {(layer, phase): LayerTiming(
                tuple((k.host_s, k.device_s) for k in kernels),
                call_s if phase == "backward" and layer != first_backward else 0.0)
            for (layer, phase), kernels in by_layer.items()}


def _layer_rows(job: TrainingJob, case: dict[str, Any],
                cal: Calibration | None) -> list[LayerRow]:
    times = isolated_layer_times(job, cal)
    kinds = {layer.name: layer_kind(layer) for layer in job.model.layers}
    rows = []
    for measured in case.get("layers", []):
        for phase in ("forward", "backward"):
            key = (measured["layer"], phase)
            if phase in measured and key in times:
                looped = measured[phase].get("inner", 1) > 1
                rows.append(LayerRow(measured["layer"], phase,
                                     times[key].seconds(job.device.is_gpu, looped),
                                     measured[phase]["median_s"],
                                     kinds.get(measured["layer"], "")))
    return rows


def predict_case(case: dict[str, Any], device: DeviceProfile,
                 cal: Calibration | None = None, tied_weights: bool = True) -> CaseRow:
    """Prediction for one measured training-step case; ``tied_weights`` False: the runner
    gave tied heads a weight of their own (files measured before it tied them)."""
    model = model_from_spec(case["model"])
    if not tied_weights:
        model = model.untied()
    job = TrainingJob(model, device, case["batch_size"], case["precision"],
                      optimizer=case.get("optimizer", "adam"), loader_workers=0)
    step = simulate_step(job, cal)
    return CaseRow(case["id"], model.name, case["batch_size"], case["precision"],
                   step.step_time_s, case["step"]["median_s"], step.peak_memory_bytes,
                   case.get("peak_memory_bytes"), _layer_rows(job, case, cal),
                   step.breakdown_s.get("host_dispatch", 0.0) / step.step_time_s,
                   _phases(job, cal, case.get("phases", {})))


# The phases the models suite times inside the step on a CPU.
STEP_PHASES = ("forward", "backward", "optimizer")


def _phases(job: TrainingJob, cal: Calibration | None, measured: dict[str, Any]
            ) -> dict[str, tuple[float, float]]:
    """Phase -> (predicted, measured) seconds. On a CPU the host dispatches and computes in
    turn, so a phase takes its kernels' host and device time (recompute is backward's)."""
    if not measured or job.device.is_gpu:
        return {}
    plan = lower(job, cal)
    predicted: dict[str, float] = defaultdict(float)
    for k in (*plan.microbatch, *plan.optimizer):
        phase = "backward" if k.phase == "recompute" else k.phase
        predicted[phase] += k.host_s + k.device_s
    return {k: (predicted[k], measured[k]["median_s"]) for k in STEP_PHASES if k in measured}


def validate_file(path: str | Path, calibration: Calibration | None = None,
                  device: DeviceProfile | None = None) -> DeviceReport:
    """Compare every case of models-suite file ``path`` with its prediction."""
    data = results.load(path, suite="models")
    if device is None:
        found = catalog().find(data["device"])
        if not isinstance(found, DeviceProfile):
            raise InvalidMeasurement(f"{path}: {data['device']} is not a device profile")
        device = found
    cal_name = (calibration or calibration_for(device)).name
    rows, skipped = [], []
    for case in data["cases"]:
        if "skipped" in case:
            skipped.append(f"{case['id']}: {case['skipped']} (when measured)")
            continue
        try:
            rows.append(predict_case(case, device, calibration,
                                     data.get("switches", {}).get("tied_weights", False)))
        except GpusimError as exc:
            skipped.append(f"{case['id']}: {exc}")
    return DeviceReport(device.name, results.display_path(path), cal_name, rows, skipped)


def validate_all(root: str | Path | None = None, device: str | None = None,
                 calibration: Calibration | None = None,
                 runs: bool = False) -> list[DeviceReport]:
    """Reports for every device with a committed models suite (or only ``device``); with
    ``runs``, one per repeat run too (each device's models.json first)."""
    root = Path(root) if root is not None else results.measurements_dir()
    name = catalog().find(device).name if device else None
    files = results.find(root, "models", name, runs)
    if not files:
        where = f" for {name}" if name else ""
        device_hint = name or "<device>"
        raise InvalidMeasurement(
            f"no models-suite measurements{where} under {root}; measure them on that "
            f"device with `gpusim measure --suite models --out measurements/{device_hint}` "
            f"(and the micro suite, for `gpusim calibrate`), see measurements/README.md")
    return [validate_file(f, calibration) for f in files]


def cross_device_ranking(reports: list[DeviceReport]) -> dict[str, float]:
    """Per case id measured on several devices: do predictions order the devices as measured?"""
    by_case: dict[str, list[tuple[float, float]]] = defaultdict(list)
    seen: set[str] = set()
    for rep in reports:
        if rep.device in seen:  # a repeat run: the devices, not the runs, are compared
            continue
        seen.add(rep.device)
        for row in rep.rows:
            by_case[row.id].append((row.predicted_s, row.measured_s))
    return {cid: ranking_agreement(pairs) for cid, pairs in by_case.items() if len(pairs) > 1}


def run_spread(reports: list[DeviceReport]) -> dict[str, dict[str, dict[str, float]]]:
    """Per device measured more than once: how far its runs' measured step times lie
    apart, per case as max / min - 1, summarised (median, max) for the cases its first
    run's predictions call device-bound and host-bound. What no model of one machine can
    predict better: how much the same machine type moves between leases."""
    by_device: dict[str, list[DeviceReport]] = defaultdict(list)
    for rep in reports:
        by_device[rep.device].append(rep)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for device, reps in by_device.items():
        if len(reps) < 2:
            continue
        measured: dict[str, list[float]] = defaultdict(list)
        for rep in reps:
            for row in rep.rows:
                measured[row.id].append(row.measured_s)
        kinds: dict[str, dict[str, float]] = {}
        for host_bound, key in ((False, "device_bound"), (True, "host_bound")):
            spreads = [max(v) / min(v) - 1 for row in reps[0].rows
                       if row.host_bound == host_bound and len(v := measured[row.id]) > 1]
            if spreads:
                kinds[key] = {"cases": len(spreads), "median": statistics.median(spreads),
                              "max": max(spreads)}
        out[device] = {"runs": {"count": len(reps)}, **kinds}
    return out
