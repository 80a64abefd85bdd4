"""One kernel, predicted and, where the project measured the same case, compared: how a user
checks the building blocks (``gpusim kernel``).

A kernel is described as a micro-suite case (``gpusim/measure/runner.py`` names them), so
the prediction is the one calibration is fitted against, and a committed measurement of the
same case id on the same device is found and shown beside it.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from gpusim.calibrate.micro_ops import SDPA_KERNELS, case_ops, predict
from gpusim.cost.kernels import kernel_cost
from gpusim.errors import InvalidConfig
from gpusim.hardware.calibration import Calibration, calibration_for
from gpusim.hardware.profile import DeviceProfile
from gpusim.measure import results

KERNELS_BY_NAME = {name: backend for backend, name in SDPA_KERNELS.items()}


@dataclass(frozen=True)
class KernelPrediction:
    case_id: str
    device: str
    seconds: float  # as the micro suite times it: in a loop, the host's issue cost included
    kernel_seconds: float  # the device's own time
    flops: float
    bytes: float
    bound: str
    efficiency: float  # achieved fraction of the peak that bounds it (FLOP/s or bandwidth)
    calibration: str
    measured_s: float | None = None
    measured_in: str | None = None
    exposed_write_s: float = 0.0  # of kernel_seconds: a product's result write not hidden
    # the measurement timed the kernels alone (a published figure), not the suite's loop
    measured_kernel_only: bool = False

    @property
    def achieved_tflop_s(self) -> float:
        return self.flops / self.seconds / 1e12

    @property
    def achieved_gb_s(self) -> float:
        return self.bytes / self.seconds / 1e9

    @property
    def error(self) -> float | None:
        """The prediction over the measurement, minus 1: the device's own time where the
        measurement timed the kernels alone."""
        if self.measured_s is None:
            return None
        predicted = self.kernel_seconds if self.measured_kernel_only else self.seconds
        return predicted / self.measured_s - 1

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case_id, "device": self.device, "predicted_s": self.seconds,
                "kernel_s": self.kernel_seconds, "flops": self.flops, "bytes": self.bytes,
                "achieved_tflop_s": self.achieved_tflop_s, "achieved_gb_s": self.achieved_gb_s,
                "bound": self.bound, "efficiency": self.efficiency,
                "calibration": self.calibration, "measured_s": self.measured_s,
                "measured_in": self.measured_in, "error": self.error,
                "measured_kernel_only": self.measured_kernel_only,
                "exposed_write_s": self.exposed_write_s}


def gemm_case(m: int, n: int, k: int, precision: str) -> dict[str, Any]:
    return {"id": f"gemm/{precision}/{m}x{n}x{k}", "kind": "gemm", "precision": precision,
            "m": m, "n": n, "k": k}


# The input types SDPA takes: 16-bit (every kernel) and fp32 (the memory-efficient kernel
# alone: FlashAttention and cuDNN take 16-bit inputs only).
ATTENTION_PRECISIONS = ("bf16", "fp16", "fp32")


def attention_case(batch: int, heads: int, kv_heads: int, seq: int, head_dim: int,
                   causal: bool, kernel: str, phase: str, precision: str = "bf16"
                   ) -> dict[str, Any]:
    """SDPA as the micro suite runs it, in ``precision``: ``kernel`` auto (SDPA's choice)
    or a named kernel (flash2, cudnn, efficient)."""
    if kernel != "auto" and kernel not in KERNELS_BY_NAME:
        raise InvalidConfig(f"unknown attention kernel {kernel!r}; use auto or "
                            f"{', '.join(KERNELS_BY_NAME)}")
    if precision not in ATTENTION_PRECISIONS:
        raise InvalidConfig(f"SDPA takes {', '.join(ATTENTION_PRECISIONS)} inputs, not "
                            f"{precision}")
    if precision == "fp32" and kernel not in ("auto", "efficient"):
        raise InvalidConfig(f"{kernel} takes 16-bit inputs only; on fp32 ones SDPA runs its "
                            "memory-efficient kernel: use --kernel auto or efficient")
    if heads % kv_heads:
        raise InvalidConfig(f"heads {heads} is not divisible by kv heads {kv_heads}")
    backend = KERNELS_BY_NAME.get(kernel, "auto")
    key = f"{batch}x{heads}x{kv_heads}x{seq}x{head_dim}" + ("-causal" if causal else "")
    # the micro suite names its 16-bit cases by backend alone, as bf16 ran first
    typed = "" if precision == "bf16" else f"{precision}/"
    return {"id": f"sdpa/{typed}{backend}/{key}/{phase}", "kind": "sdpa",
            "precision": precision, "backend": backend, "batch": batch, "heads": heads,
            "kv_heads": kv_heads, "seq": seq, "head_dim": head_dim, "causal": causal,
            "pass": phase}


def row_case(op: str, rows: int, cols: int, phase: str, upcast: bool = False,
             compiled: bool = False) -> dict[str, Any]:
    """A bf16 row kernel as the micro suite times it (a norm, an activation): ``upcast`` the
    RMS norm written as upcasting ops, ``compiled`` under torch.compile."""
    if upcast and op != "rms_norm":
        raise InvalidConfig("--upcast is the RMS norm written as separate fp32 ops; "
                            f"--op {op} has no such form")
    form = "-".join(w for w in ("upcast" if upcast else "", "compiled" if compiled else "")
                    if w)
    return {"id": f"kernel/{op}{'-' + form if form else ''}/{rows}x{cols}/{phase}",
            "kind": "row_kernel", "op": op, "rows": rows, "cols": cols, "precision": "bf16",
            "pass": phase, **({"upcast": "cast_back"} if upcast else {}),
            **({"compiled": True} if compiled else {})}


def memory_case(op: str, n_bytes: int) -> dict[str, Any]:
    return {"id": f"elementwise/{op}/{n_bytes}", "kind": "elementwise", "op": op,
            "bytes": n_bytes, "dtype": "fp32"}


@lru_cache(maxsize=8)
def _measured_cases(device: str) -> dict[str, tuple[float, str]]:
    """Case id -> (median over the runs, where) in the device's committed micro files
    (micro.json, its repeat runs, and micro cases converted from the GPU probes): one run
    can be an outlier (the H100's 8192x8192x64 took 116 us in one run and 56-57 us in
    four); read once per device."""
    runs: dict[str, list[tuple[float, str]]] = {}
    derived = sorted((results.measurements_dir() / device).glob("micro-sdpa*.json"))
    for path in [*results.find(results.measurements_dir(), "micro", device, runs=True),
                 *derived]:
        for row in json.loads(path.read_text())["cases"]:
            if "median_s" in row and not row.get("graph"):
                runs.setdefault(row["id"], []).append(
                    (float(row["median_s"]), results.display_path(path)))
    return {case: (statistics.median(v for v, _ in found),
                   found[0][1] if len(found) == 1
                   else f"median of {len(found)} runs: {found[0][1]} and its repeats")
            for case, found in runs.items()}


# What a case records about how and where it was timed, not what it runs.
_NOT_SHAPE = frozenset({"id", "median_s", "p10_s", "p90_s", "repeats", "inner", "source",
                        "timed", "fit", "graph"})


def _shape_key(case: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """What a case runs, whichever file names it: its shape fields, unset ones left out
    (a product's layout is row-major unless it says otherwise)."""
    fields = {k: v for k, v in case.items()
              if k not in _NOT_SHAPE and v is not None and v is not False}
    if fields.get("kind") == "gemm":
        fields.setdefault("layout", "nn")
    return tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in fields.items()))


@lru_cache(maxsize=8)
def _published_cases(device: str) -> dict[tuple[tuple[str, str], ...], tuple[float, str]]:
    """Shape -> (seconds, where) of the device's published kernel figures
    (measurements/published/<device>/micro.json, each case citing its source)."""
    path = results.measurements_dir() / "published" / device / "micro.json"
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    titles = {src["id"]: src.get("title", src["id"])
              for src in data.get("provenance", {}).get("sources", [])}
    where = results.display_path(path)
    return {_shape_key(row): (float(row["median_s"]),
                              f"{where}: {titles.get(row.get('source'), row.get('source'))}")
            for row in data["cases"] if "median_s" in row}


def _measured(case: dict[str, Any], device: DeviceProfile
              ) -> tuple[float | None, str | None, bool]:
    """The median of the same case in the device's committed micro files, else a published
    figure of the same kernel (timed alone), if any: (seconds, where, kernel alone)."""
    found = _measured_cases(device.name).get(case["id"])
    if found is not None:
        return (*found, False)
    published = _published_cases(device.name).get(_shape_key(case))
    return (*published, True) if published is not None else (None, None, False)


def predict_kernel(case: dict[str, Any], device: DeviceProfile,
                   calibration: Calibration | None = None) -> KernelPrediction:
    cal = calibration or calibration_for(device)
    ops = case_ops(case, device)
    if not ops:
        raise InvalidConfig(f"{case['id']}: no kernel to cost")
    costs = [kernel_cost(op, device, cal) for op in ops]
    seconds = predict(case, device, cal)
    main = max(costs, key=lambda c: c.seconds)
    measured, where, kernel_only = _measured(case, device)
    n_bytes = sum(op.bytes for op in ops)
    # The fraction of what bounds it: the unit's FLOP/s, or the memory bandwidth.
    efficiency = (main.efficiency if main.bound == "compute"
                  else n_bytes / seconds / device.memory_bandwidth)
    return KernelPrediction(
        case["id"], device.name, seconds, sum(c.seconds for c in costs),
        sum(op.flops for op in ops), n_bytes, main.bound, efficiency, cal.name, measured,
        where, sum(c.exposed_write_s for c in costs), kernel_only)
