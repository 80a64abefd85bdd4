"""GEMM efficiencies the fit takes from elsewhere than a precision's own cases: from a
precision timed on the same matrix units at the same peak, and held to the fastest a
published search over shapes found (a bound, never a fit)."""

from __future__ import annotations

from typing import Any

from gpusim.calibrate.micro_ops import predict
from gpusim.hardware.calibration import Calibration
from gpusim.hardware.profile import DeviceProfile


def same_rate_precisions(cal: dict[str, Any], device: DeviceProfile,
                         fitted: dict[str, float]) -> str:
    """A precision no GEMM case timed takes the efficiency of one that was timed on the same
    matrix units at the same peak (fp16 and bf16 on every tensor-core GPU): one measured
    library, not a default, then speaks for both."""
    prefix = "gemm.max_efficiency."
    fitted = {k[len(prefix):]: v for k, v in fitted.items() if k.startswith(prefix)}
    peaks = {str(k): v for k, v in device.matrix_tflops.items()}
    taken = []
    for precision in list(cal["gemm"]["max_efficiency"]):
        twin = next((q for q in fitted if q != precision and precision not in fitted
                     and precision in peaks and peaks.get(q) == peaks[precision]), None)
        if twin is not None:
            cal["gemm"]["max_efficiency"][precision] = fitted[twin]
            taken.append(f"{precision} from {twin}")
    return (f" Precisions no GEMM case timed, from one at the same peak: "
            f"{', '.join(taken)}." if taken else "")


# Shapes a searched maximum bounds, as a search over shapes would try them: M and N in
# steps of 1024 up to 16384, K from 1024 to past the knee of long_k_slope.
_SEARCH_SIDES = range(1024, 16385, 1024)
_SEARCH_K = (1024, 2048, 4096, 8192, 13312)


def fastest_shape(precision: str, device: DeviceProfile, cal: Calibration) -> float:
    """The highest FLOP rate predicted for any shape of the search grid."""
    return max(2 * m * n * k / predict({"id": f"gemm/{precision}/{m}x{n}x{k}", "kind": "gemm",
                                        "precision": precision, "m": m, "n": n, "k": k},
                                       device, cal)
               for m in _SEARCH_SIDES for n in _SEARCH_SIDES for k in _SEARCH_K)


def bound_by_maxima(cal: dict[str, Any], cases: list[dict[str, Any]],
                     device: DeviceProfile) -> str:
    """No shape runs faster than the fastest a search over shapes found: where the
    calibration predicts a searched maximum (a GEMM case kept out of the fit, ``fit:
    false``), or any shape of a search grid, faster than that maximum was measured, its
    precision's efficiency is lowered until the prediction meets it. A bound, not a fit:
    typical shapes may still run slower."""
    held = []
    for precision in sorted(cal["gemm"]["max_efficiency"]):
        maxima = [c for c in cases if c.get("fit") is False and c["kind"] == "gemm"
                  and c.get("precision") == precision and "median_s" in c]
        if not maxima:
            continue
        best = max(2 * c["m"] * c["n"] * c["k"] / c["median_s"] for c in maxima)
        start = cal["gemm"]["max_efficiency"][precision]
        for _ in range(8):  # ramps and quantization make time not quite inverse to it
            trial = Calibration.model_validate(cal)
            ratio = min([predict(c, device, trial) / c["median_s"] for c in maxima]
                        + [best / fastest_shape(precision, device, trial)])
            if ratio >= 0.999:
                break
            cal["gemm"]["max_efficiency"][precision] *= ratio
        if cal["gemm"]["max_efficiency"][precision] < start:
            held.append(f"{precision} {start:.3g} -> "
                        f"{cal['gemm']['max_efficiency'][precision]:.3g}")
    return (f" Held to the searched maxima (no shape faster than the fastest a search "
            f"found): {', '.join(held)}." if held else "")
