"""``gpusim calibrate``: fit a device's efficiencies to its micro suite, and nothing else.

Each group of parameters is fitted to the cases that exercise it, in an order where later
groups rest on earlier ones: host dispatch and the per-kernel gap (read off directly), memory
efficiency and ramp (elementwise kernels that reuse their buffers), the matrix efficiency of
each precision with one ramp (GEMMs), then the convolution and attention factors, PCIe
efficiency (pinned copies), and on a CPU the page-fault rate of fresh large allocations
(elementwise kernels that allocate their output). The objective is the mean absolute log
ratio of predicted to measured time, so a case twice too slow weighs as much as one twice
too fast. Search is a
log-spaced grid per parameter, refined around the best, in a few rounds of coordinate
descent: no parameter can leave its schema range, and the result is deterministic.

The input must be a micro-suite file; a models-suite file is refused, so no validation data
can enter a fit.
"""

from __future__ import annotations

import copy
import datetime
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpusim.calibrate.attention_terms import auto_attention, record_attention_ranges
from gpusim.calibrate.gemm_maxima import bound_by_maxima, same_rate_precisions
from gpusim.calibrate.groups import BOTH_PASSES, Path_, fit_groups
from gpusim.calibrate.micro_ops import (
    layer_host_job,
    layer_host_times,
    looped_case,
    predict,
)
from gpusim.errors import InvalidMeasurement
from gpusim.hardware.calibration import Calibration, stated_defaults
from gpusim.hardware.catalog import catalog, profiles_dir
from gpusim.hardware.profile import DeviceProfile
from gpusim.measure import results
from gpusim.plan.lower import layer_kind
from gpusim.validate.compare import LayerTiming

ROUNDS = 3


@dataclass(frozen=True)
class GroupFit:
    """How well one group of micro cases is predicted, before and after the fit."""

    group: str
    cases: int
    parameters: dict[str, float]
    error_before: float  # mean absolute relative error, as a fraction
    error_after: float
    worst_case: str
    worst_error: float  # signed relative error of the worst case after the fit
    # the fit's objective, the mean |log(predicted / measured)|, before and after
    log_error_before: float = 0.0
    log_error_after: float = 0.0


@dataclass(frozen=True)
class FitResult:
    calibration: Calibration
    groups: list[GroupFit]
    source: str


# A parameter path ending in this sets a kernel's forward and backward factors as one.


def _stored(path: Path_) -> Path_:
    """Where a parameter's value is read back: a tied pair's forward factor."""
    return (*path[:-1], "forward") if path[-1] == BOTH_PASSES else path


def _get(data: dict[str, Any], path: Path_) -> float:
    node: Any = data
    for key in _stored(path):
        node = node[key]
    return float(node)


def _has(data: dict[str, Any], path: Path_) -> bool:
    """Whether the fit set ``path`` (one no case moves is left as the defaults have it)."""
    node: Any = data
    for key in _stored(path):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return node is not None  # e.g. a CPU's cache rate where no cache regime was found


def _set(data: dict[str, Any], path: Path_, value: float) -> None:
    node: Any = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    if path[-1] == BOTH_PASSES:
        node["forward"] = node["backward"] = value
    else:
        node[path[-1]] = value


def _log_error(cases: list[dict[str, Any]], device: DeviceProfile, cal: Calibration) -> float:
    return statistics.fmean(abs(math.log(predict(c, device, cal) / c["median_s"]))
                            for c in cases)


def _relative_errors(cases: list[dict[str, Any]], device: DeviceProfile,
                     cal: Calibration) -> list[tuple[float, str]]:
    return [(predict(c, device, cal) / c["median_s"] - 1, c["id"]) for c in cases]


def _search(lo: float, hi: float, score: Callable[[float], float], zero: bool) -> float:
    """Best value on a log grid over [lo, hi] (and 0 when allowed), refined twice, never
    leaving [lo, hi]."""
    grid = [lo * (hi / lo) ** (i / 40) for i in range(41)]
    best = min(([0.0] if zero else []) + grid, key=score)
    step = (hi / lo) ** (1 / 40)
    for _ in range(2):
        if best == 0.0:
            break
        grid = [best * step ** (i / 10 - 1) for i in range(21)]
        best = min((v for v in grid if lo <= v <= hi), key=score)
        step = step ** 0.1
    return float(best)


# Ranges per parameter kind: efficiencies are fractions of peak, ramps and gaps microseconds.
_RANGE = {"efficiency": (0.005, 1.0, False), "factor": (0.05, 1.0, False),
          "slope": (0.002, 0.5, True), "share": (0.01, 1.0, True), "blocks": (0.05, 64.0, True),
          "dims": (1.0, 512.0, True),
          "us": (0.01, 5000.0, True), "gb_s": (0.1, 1000.0, False)}


def _fit_group(data: dict[str, Any], params: list[tuple[Path_, str]],
               cases: list[dict[str, Any]], device: DeviceProfile) -> None:
    """Coordinate descent over ``params`` on ``cases``, updating ``data`` in place."""

    def score_with(path: Path_) -> Callable[[float], float]:
        def score(value: float) -> float:
            trial = copy.deepcopy(data)
            _set(trial, path, value)
            return _log_error(cases, device, Calibration.model_validate(trial))
        return score

    for _ in range(ROUNDS):
        for path, kind in params:
            lo, hi, zero = _RANGE[kind]
            score = score_with(path)
            if score(lo) == score(hi):  # no case moves with it (e.g. forward cases only)
                continue
            _set(data, path, _search(lo, hi, score, zero))


def _load_runs(paths: list[str | Path]) -> list[dict[str, Any]]:
    runs = []
    for path in paths:
        data = results.load(path, suite="micro")
        if data.get("quick"):
            raise InvalidMeasurement(f"{path} is a --quick smoke run; calibrate from a full "
                                     "suite")
        runs.append(data)
    devices = {r["device"] for r in runs}
    if len(devices) > 1:
        raise InvalidMeasurement(f"micro suites of different devices ({', '.join(devices)}); "
                                 "calibrate one device at a time")
    return runs


def _host_figure(runs: list[dict[str, Any]], kind: str, pass_: str | None = None
                 ) -> float | None:
    """A host-side figure (dispatch, launch, autograd) as the median over repeated runs:
    on shared or virtual machines these move between runs far more than kernel times."""
    values = [c["median_s"] for r in runs for c in r["cases"]
              if c["kind"] == kind and c.get("pass") == pass_ and "median_s" in c]
    return statistics.median(values) if values else None


def _fit_sustained(cal: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    """gemm.sustained_factor: in each run with a sustained_gemm case, the same product's
    burst time (its gemm case) over its steady-state time; the median over runs, at most 1.
    Returns the rationale's sentence ("" where no run has the pair)."""
    ratios = []
    for run in runs:
        bursts = {(c["precision"], c["m"], c["n"], c["k"]): c["median_s"]
                  for c in run["cases"] if c["kind"] == "gemm" and "median_s" in c}
        for c in run["cases"]:
            key = (c.get("precision"), c.get("m"), c.get("n"), c.get("k"))
            if c["kind"] == "sustained_gemm" and "median_s" in c and key in bursts:
                ratios.append(bursts[key] / c["median_s"])
    if not ratios:
        return ""
    factor = round(min(1.0, statistics.median(ratios)), 4)
    cal["gemm"]["sustained_factor"] = factor
    return (f" Products sustained for seconds run at {factor} of their bursts' rate "
            f"(sustained_gemm, {len(ratios)} run{'s' if len(ratios) > 1 else ''}).")


def fit(path: str | Path | list[str | Path], device: DeviceProfile | None = None,
        bound_by: list[str | Path] | None = None) -> FitResult:
    """Fit the calibration of the device measured in micro-suite file ``path`` (or in
    several runs of it: their cases pooled, host figures their median). The searched maxima
    in ``bound_by`` (published files of the same device) bound the GEMM efficiencies."""
    paths = list(path) if isinstance(path, list) else [path]
    runs = _load_runs(paths)
    bounds = _load_runs(list(bound_by or []))
    others = sorted({r["device"] for r in bounds} - {r["device"] for r in runs})
    if others:
        raise InvalidMeasurement(f"--bound-by files must be of the device the fit measures "
                                 f"({runs[0]['device']}), not {', '.join(others)}")
    data = runs[-1]
    if device is None:
        found = catalog().find(data["device"])
        if not isinstance(found, DeviceProfile):
            raise InvalidMeasurement(f"{paths[0]}: {data['device']} is not a device profile")
        device = found
    base = stated_defaults(device)
    cal = base.model_dump()
    cases = [c for r in runs for c in r["cases"]]
    direct = {k: v for k in ("dispatch", "launch") if (v := _host_figure(runs, k)) is not None}
    autograd = {p: v for p in ("forward", "backward", "module", "backward_call")
                if (v := _host_figure(runs, "autograd", p)) is not None}
    if "launch" in direct:
        cal["overhead"]["kernel_us"] = direct["launch"] * 1e6
    if "dispatch" in direct:
        launch = cal["overhead"]["launch_us"] if device.is_gpu else 0.0
        cal["overhead"]["launch_us"] = launch
        cal["overhead"]["dispatch_us"] = max(0.0, direct["dispatch"] * 1e6 - launch)
        if autograd:  # forward and backward nodes alike: their mean, over a bare dispatch
            node = (autograd["forward"] + autograd["backward"]) / 2
            cal["overhead"]["autograd_us"] = max(0.0, (node - direct["dispatch"]) * 1e6)
            # a one-op module call and a one-node backward() call, beyond that one op
            over = {"module_us": autograd["module"], "backward_call_us":
                    autograd["backward_call"]}
            for key, seconds in over.items():
                cal["overhead"][key] = max(0.0, (seconds - node) * 1e6)

    fits = []
    shared = ""
    for name, group_cases, params in fit_groups(cases, device):
        before = Calibration.model_validate(cal)
        if name == "memory" and not device.is_gpu:
            cal = _fit_cache_regime(cal, params, group_cases, device)
        else:
            record_attention_ranges(cal, params, group_cases, device)
            _fit_group(cal, params, group_cases, device)
        fitted = {".".join(p): _get(cal, p) for p, _ in params if _has(cal, p)}
        if name == "memory" and cal["memory"].get("cache_mib"):
            fitted["memory.cache_mib"] = cal["memory"]["cache_mib"]
        fits.append(_group_fit(name, group_cases, device, before, cal, fitted))
        if name == "gemm":  # before anything is fitted relative to the GEMM efficiencies
            shared = same_rate_precisions(cal, device, fitted)
    bounded = bound_by_maxima(cal, cases + [c for r in bounds for c in r["cases"]], device)
    auto = auto_attention(cal, data)
    sustained = _fit_sustained(cal, runs)
    layers = [c for c in cases if c["kind"] == "layer_host" and "median_s" in c]
    if layers:
        fits.append(_fit_layer_host(cal, layers, device))

    today = datetime.date.today().isoformat()
    what = ("published microbenchmarks (each case cites its source) transcribed"
            if data["provenance"].get("published") else "the micro suite measured")
    summary = "; ".join(f"{g.group} {g.cases} cases, mean error {g.error_after:.1%}"
                        for g in fits)
    cal.update({
        "name": f"{device.name}-fitted", "device": device.name, "architecture": None,
        "status": "fitted", "fitted_on": [results.display_path(p) for p in paths],
        "bounded_by": [results.display_path(p) for p in bound_by or []],
        "rationale": f"Fitted by gpusim calibrate on {today} to {what} "
                     f"{data['provenance'].get('date', '')[:10]} ({summary}).{shared}{bounded}"
                     f"{auto}{sustained} "
                     f"Parameters not in the suite keep the values of {base.name}.",
    })
    return FitResult(Calibration.model_validate(cal), fits,
                     ", ".join(results.display_path(p) for p in paths))


# Sizes a CPU's cache regime may end at (MiB an op moves): its cores' L2 up to a share of L3.
CACHE_MIB_CANDIDATES = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


def _fit_cache_regime(cal: dict[str, Any], params: list[tuple[Path_, str]],
                      cases: list[dict[str, Any]], device: DeviceProfile) -> dict[str, Any]:
    """A CPU's memory rates: ops that fit in its caches run faster than those that stream
    from DRAM, so the fit tries each size the cache regime may end at (and none), fits the
    two rates for each, and keeps the best."""
    best: tuple[float, dict[str, Any]] | None = None
    for cache_mib in (None, *CACHE_MIB_CANDIDATES):
        trial = copy.deepcopy(cal)
        trial["memory"]["cache_mib"] = cache_mib
        trial["memory"]["cache_efficiency"] = (trial["memory"]["max_efficiency"]
                                               if cache_mib else None)
        _fit_group(trial, params, cases, device)  # (no regime: cache_efficiency moves nothing)
        error = _log_error(cases, device, Calibration.model_validate(trial))
        if best is None or error < best[0] - 1e-9:
            best = (error, trial)
    assert best is not None
    return best[1]


def _fit_layer_host(cal: dict[str, Any], cases: list[dict[str, Any]],
                    device: DeviceProfile) -> GroupFit:
    """Host cost per layer kind and phase, beyond module_us and the layer's kernels, from
    tiny models' layers timed alone. Each kind's cost only moves its own layers, so each
    is a one-dimensional fit over host seconds computed once without it."""
    before = Calibration.model_validate(cal)
    bare = copy.deepcopy(cal)
    bare["overhead"]["layer_us"], bare["overhead"]["layer_backward_us"] = {}, {}
    base = Calibration.model_validate(bare)
    by_kind: dict[tuple[str, str], list[tuple[LayerTiming, bool, float]]] = {}
    kinds: dict[str, dict[str, str]] = {}
    for c in cases:
        timing = layer_host_times(c, device, base)
        spec = json.dumps(c["model"], sort_keys=True)
        if spec not in kinds:
            model = layer_host_job(c, device).model
            kinds[spec] = {la.name: layer_kind(la) for la in model.layers}
        layer, phase = c["pass"].rsplit("/", 1)
        kind = kinds[spec][layer]
        by_kind.setdefault((kind, phase), []).append((timing, looped_case(c), c["median_s"]))
    params = {}
    for (kind, phase), rows in sorted(by_kind.items()):
        def score(us: float, rows: list[tuple[LayerTiming, bool, float]] = rows) -> float:
            return statistics.fmean(
                abs(math.log(t.seconds(device.is_gpu, looped, us * 1e-6) / m))
                for t, looped, m in rows)
        key = "layer_us" if phase == "forward" else "layer_backward_us"
        value = _search(*_RANGE["us"][:2], score, True)
        cal["overhead"][key][kind] = value
        params[f"overhead.{key}.{kind}"] = value
    return _group_fit("layer host", cases, device, before, cal, params)


def _group_fit(name: str, cases: list[dict[str, Any]], device: DeviceProfile,
               before: Calibration, fitted: dict[str, Any],
               params: dict[str, float]) -> GroupFit:
    """How a group's cases were predicted before its fit and after (``fitted``)."""
    after = Calibration.model_validate(fitted)
    errs_before = _relative_errors(cases, device, before)
    errs = _relative_errors(cases, device, after)
    worst, worst_id = max(errs, key=lambda e: abs(e[0]))
    return GroupFit(name, len(cases), params,
                    statistics.fmean(abs(e) for e, _ in errs_before),
                    statistics.fmean(abs(e) for e, _ in errs), worst_id, worst,
                    _log_error(cases, device, before), _log_error(cases, device, after))


def for_architecture(result: FitResult) -> FitResult:
    """The same fit, as the calibration of the measured device's architecture: the GPUs of
    one architecture share SMs, tensor cores and software, and differ mostly in the
    datasheet figures (clocks, memory bandwidth) the model already takes per device."""
    cal = result.calibration
    device = catalog().find(str(cal.device))
    if not isinstance(device, DeviceProfile):
        raise InvalidMeasurement(f"{cal.device} is not a device profile")
    arch = device.architecture
    rationale = (f"Fitted on {device.name} and used for every {arch} device without a fit "
                 f"of its own. " + cal.rationale)
    moved = cal.model_copy(update={"name": f"{arch}-fitted-on-{device.name}",
                                   "architecture": arch, "device": None,
                                   "rationale": rationale})
    return FitResult(Calibration.model_validate(moved.model_dump()), result.groups,
                     result.source)


def rounded(value: Any, digits: int = 4) -> Any:
    """Floats to ``digits`` significant figures (what a fit can claim), recursively."""
    if isinstance(value, float) and value:
        return round(value, digits - 1 - math.floor(math.log10(abs(value))))
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    return value


def write(result: FitResult, out: str | Path) -> Path:
    out = Path(out)
    body = rounded(result.calibration.model_dump(exclude_none=True, exclude={"power"}))
    header = ("# Written by `gpusim calibrate` from the micro suite named in fitted_on.\n"
              "# Do not edit by hand: measure again and re-run it.\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + yaml.safe_dump(body, sort_keys=False, width=100))
    return out


def default_output(device_name: str) -> Path:
    return profiles_dir() / "calibration" / f"{device_name}.yaml"
