"""Attention's fitted terms beyond its factors: the range of shapes a kernel's shape terms
were fitted on (past which they are held flat), and the kernel SDPA picks by default where
the suite names one instead of timing SDPA's own choice."""

from __future__ import annotations

from typing import Any

from gpusim.calibrate.groups import Path_
from gpusim.calibrate.micro_ops import SDPA_KERNELS, case_ops
from gpusim.cost.kernels import key_blocks_per_query_block
from gpusim.hardware.calibration import ATTENTION_SHAPE_TERMS
from gpusim.hardware.profile import DeviceProfile


def record_attention_ranges(cal: dict[str, Any], params: list[tuple[Path_, str]],
                            cases: list[dict[str, Any]], device: DeviceProfile) -> None:
    """Where a group fits an attention kernel's shape terms, the range its cases span (the
    most key blocks per query block, the widest head), past which the terms are held flat."""
    for where, _ in params:
        if where[:2] == ("gemm", "attention_tile_overhead"):
            cal["gemm"].setdefault("attention_longest", {})[where[2]] = max(
                key_blocks_per_query_block(op.attention) for c in cases
                for op in case_ops(c, device) if op.attention is not None)
        if where[:2] == ("gemm", "attention_softmax_width"):
            cal["gemm"].setdefault("attention_widest", {})[where[2]] = max(
                c["head_dim"] for c in cases if "head_dim" in c)


def auto_attention(cal: dict[str, Any], data: dict[str, Any]) -> str:
    """Where the suite timed no SDPA "auto" cases (published figures name their kernel), the
    default attention is the kernel the file says SDPA picks on this GPU, as fitted."""
    backend = data.get("sdpa_auto_backend")
    if not backend or any(c.get("backend") == "auto" or c["kind"] == "attention"
                          for c in data["cases"]):
        return ""
    fitted = cal["gemm"].get("attention_kernels", {}).get(SDPA_KERNELS.get(backend, ""))
    if not fitted:
        return ""
    for term in ATTENTION_SHAPE_TERMS:
        per_kernel = cal["gemm"].get(term, {})
        if SDPA_KERNELS[backend] in per_kernel:
            per_kernel["auto"] = per_kernel[SDPA_KERNELS[backend]]
    if "forward" in fitted:
        cal["gemm"]["attention_factor"] = fitted["forward"]
    if "backward" in fitted:
        cal["gemm"]["attention_backward_factor"] = fitted["backward"]
    return (f" Attention as SDPA picks it is its {backend} backend here "
            f"({SDPA_KERNELS[backend]}), as the measurements file states.")
