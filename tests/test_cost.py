"""Kernel costs: never below the roofline, monotone in bandwidth, deterministic."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from gpusim.cost.kernels import kernel_cost, quantization_efficiency
from gpusim.hardware.calibration import calibration_for
from gpusim.hardware.profile import GPUProfile
from gpusim.workload.ops import GemmShape, Op, gemm_op
from tests.strategies import any_op, gemm_ops


@settings(max_examples=200, deadline=None)
@given(op=any_op)
def test_cost_is_never_below_the_roofline(h100: GPUProfile, op: Op) -> None:
    cost = kernel_cost(op, h100, calibration_for(h100))
    peak, _ = h100.peak_flops(op.math, matrix=op.kind != "memory")  # type: ignore[arg-type]
    if op.kind == "memory":
        peak, _ = h100.peak_flops("fp32", matrix=False)
    assert cost.seconds >= op.flops / peak
    assert cost.seconds >= op.bytes / h100.memory_bandwidth


@settings(max_examples=100, deadline=None)
@given(op=any_op)
def test_less_bandwidth_is_never_faster(h100: GPUProfile, op: Op) -> None:
    slower = h100.model_copy(update={"memory_bandwidth_gb_s": h100.memory_bandwidth_gb_s / 2})
    cal = calibration_for(h100)
    assert kernel_cost(op, slower, cal).seconds >= kernel_cost(op, h100, cal).seconds


@settings(max_examples=50, deadline=None)
@given(op=gemm_ops())
def test_cost_is_deterministic(h100: GPUProfile, op: Op) -> None:
    cal = calibration_for(h100)
    assert kernel_cost(op, h100, cal) == kernel_cost(op, h100, cal)


def test_large_gemm_reaches_the_calibrated_efficiency(h100: GPUProfile) -> None:
    """A large product with K at the knee (past it the long-K slope lowers the rate) runs
    at max_efficiency, less the little of its result's write the main loop does not hide."""
    cal = calibration_for(h100)
    op = gemm_op("big", GemmShape(8192, 8192, cal.gemm.long_k_knee), "bf16", 2)
    cost = kernel_cost(op, h100, cal)
    assert cost.bound == "compute" and cost.unit == "matrix"
    assert cost.efficiency == pytest.approx(cal.gemm_efficiency("bf16"), rel=0.1)


def test_wave_quantization_penalizes_one_tile_too_many(h100: GPUProfile) -> None:
    cal = calibration_for(h100)
    full = quantization_efficiency(GemmShape(128 * 132, 128, 4096), h100, cal)
    spill = quantization_efficiency(GemmShape(128 * 133, 128, 4096), h100, cal)
    assert spill < full


def test_split_k_rescues_skinny_weight_gradients(h100: GPUProfile) -> None:
    cal = calibration_for(h100)
    # A 64 x 576 weight gradient over a long K (a ResNet stage-1 convolution).
    assert quantization_efficiency(GemmShape(64, 576, 802816), h100, cal) > 0.5


def test_small_kernels_are_dominated_by_fixed_costs(h100: GPUProfile) -> None:
    cal = calibration_for(h100)
    tiny = kernel_cost(gemm_op("t", GemmShape(16, 16, 16), "bf16", 2), h100, cal)
    assert tiny.efficiency < 0.001
    assert tiny.seconds >= (cal.gemm.ramp_us + cal.overhead.kernel_us) * 1e-6


def test_op_copies_keep_every_field() -> None:
    """Op.with_phase and Op.in_layer name every field; a field added to Op and left out of
    them would be dropped silently."""
    import dataclasses

    from gpusim.workload.ops import AttentionShape, GemmShape, Op

    values = {"name": "n", "kind": "gemm", "flops": 1.0, "bytes": 2.0, "math": "bf16",
              "layer": "l", "phase": "recompute", "gemm": GemmShape(1, 2, 3),
              "alloc_bytes": 4.0, "family": "f", "parallel_units": 5, "kernel": "k",
              "attention": AttentionShape(1, 2, 3, True), "written": 6.0, "launches": 7,
              "streams": 8, "syncs": True}
    assert set(values) == {f.name for f in dataclasses.fields(Op)}
    op = Op(**values)  # type: ignore[arg-type]
    assert op.with_phase("backward") == dataclasses.replace(op, phase="backward")
    assert op.in_layer("other") == dataclasses.replace(op, layer="other")


def test_a_short_k_product_pays_the_write_its_main_loop_does_not_hide(h100: GPUProfile) -> None:
    """A product writes its result after its main loop: with a short K (a row-parallel
    linear under TP) the write is as long as the math, and the fitted exposed share of the
    shorter of the two adds to the roofline's max; a long K hardly notices it."""
    cal = calibration_for(h100)
    exposed = cal.gemm.epilogue_exposed
    assert 0 < exposed <= 1  # fitted on the H100 micro suite's short-K products
    roofline = cal.model_copy(update={"gemm": cal.gemm.model_copy(
        update={"epilogue_exposed": 0.0})})
    short = gemm_op("row", GemmShape(98304, 4096, 512), "bf16", 2)
    long = gemm_op("long", GemmShape(8192, 8192, 4096), "bf16", 2)
    plain, paid = kernel_cost(short, h100, roofline), kernel_cost(short, h100, cal)
    write = plain.memory_s * (98304 * 4096) / (98304 * 512 + 512 * 4096 + 98304 * 4096)
    assert short.written == 2 * 98304 * 4096
    assert paid.seconds - plain.seconds == pytest.approx(
        exposed * min(plain.compute_s, write), rel=1e-6)
    assert paid.exposed_write_s == pytest.approx(paid.seconds - plain.seconds, rel=1e-6)
    assert plain.exposed_write_s == 0.0
    assert paid.seconds / plain.seconds > 1.2
    assert kernel_cost(long, h100, cal).seconds / kernel_cost(
        long, h100, roofline).seconds < 1.06


def test_fp32_products_on_shared_lane_sms_reach_the_published_share_of_the_peak() -> None:
    """Ampere GA10x and Ada AD10x SMs run INT32 work on half their FP32 lanes: fp32 products
    there run at the median share of their calibration's rate that published SGEMMs reached
    (measurements/published/shared_fp32_lanes.yaml); tensor-core products, and GPUs whose
    INT32 lanes are their own, are unchanged."""
    import statistics

    from gpusim.cost.kernels import kernel_cost
    from gpusim.cost.shared_lanes import SHARED_LANES_FILE, shared_lane_factor
    from gpusim.hardware.calibration import calibration_for
    from gpusim.hardware.catalog import load_gpu, read_yaml
    from gpusim.workload.ops import GemmShape, gemm_op

    rows = read_yaml(SHARED_LANES_FILE)["rows"]
    shares = []
    for row in rows:
        gpu = load_gpu(row["gpu"])
        assert gpu.fp32_lanes_shared_with_int32
        peak, _ = gpu.peak_flops("fp32", matrix=True)
        shares.append(row["tflops"] * 1e12 / (peak * calibration_for(gpu).gemm_efficiency("fp32")))
    factor = shared_lane_factor()
    assert factor == pytest.approx(statistics.median(shares)) and 0.5 < factor < 1.0
    shape = GemmShape(8192, 8192, 8192)
    for name in ("rtx-4090", "rtx-3090", "a10", "l4"):
        gpu = load_gpu(name)
        own = gpu.model_copy(update={"fp32_lanes_shared_with_int32": None})
        cal = calibration_for(gpu)
        fp32 = gemm_op("p", shape, "fp32", 4)
        assert kernel_cost(fp32, own, cal).seconds / kernel_cost(fp32, gpu, cal).seconds \
            == pytest.approx(factor, rel=0.02)
        if "fp16" in gpu.matrix_tflops:
            half = gemm_op("p", shape, "fp16", 2)
            assert kernel_cost(half, gpu, cal).seconds == kernel_cost(half, own, cal).seconds
    a100 = load_gpu("a100-80gb")
    assert not a100.fp32_lanes_shared_with_int32


def test_thin_products_run_at_their_fitted_efficiency() -> None:
    """A product with fewer rows (or columns) than the smallest tile is no padded tile:
    cuBLAS runs it as a GEMV-like or thin-tiled kernel, at the thin efficiency the volta fit
    takes from DeepBench's thin rows; a thin convolution keeps the tile model (cuDNN's
    kernels), and an architecture without thin cases keeps it too."""
    from dataclasses import replace

    from gpusim.hardware.catalog import load_gpu

    v100 = load_gpu("v100-sxm2-16gb")
    assert isinstance(v100, GPUProfile)
    cal = calibration_for(v100)
    assert set(cal.gemm.thin_efficiency) == {"fp16", "fp32"}
    thin = GemmShape(16, 1760, 1760)
    assert quantization_efficiency(thin, v100, cal, "fp32") == cal.gemm.thin_efficiency["fp32"]
    padded = quantization_efficiency(thin, v100, cal)  # no precision: tiles, as for a conv
    assert padded < cal.gemm.thin_efficiency["fp32"]
    assert quantization_efficiency(GemmShape(4096, 4096, 4096), v100, cal, "fp32") == (
        quantization_efficiency(GemmShape(4096, 4096, 4096), v100, cal))
    # DeepBench's V100 SGEMM 16 x 1760 x 1760 ran 38 us (2.6 TFLOP/s)
    seconds = kernel_cost(gemm_op("g", thin, "fp32", 4), v100, cal).seconds
    assert seconds == pytest.approx(38e-6, rel=0.3)
    conv = replace(gemm_op("c", thin, "fp32", 4), kind="conv")
    assert kernel_cost(conv, v100, cal).seconds > seconds
    h100 = load_gpu("h100-sxm")
    assert isinstance(h100, GPUProfile)
    assert not calibration_for(h100).gemm.thin_efficiency


def test_an_op_launched_in_rounds_costs_its_full_and_partial_rounds(h100: GPUProfile) -> None:
    """Six experts' GEMMs on four streams: a round of four side by side, then one of two;
    the rounds carry all the work between them, each with its own waves, ramp and gap."""
    from dataclasses import replace

    cal = calibration_for(h100)
    whole = gemm_op("g", GemmShape(2048, 1536, 2048, batch=6), "bf16", 2)
    launched = replace(whole, launches=6, streams=4)

    def part(experts: int) -> Op:
        share = experts / 6
        return replace(whole, flops=whole.flops * share, bytes=whole.bytes * share,
                       alloc_bytes=whole.alloc_bytes * share, written=whole.written * share,
                       gemm=GemmShape(2048, 1536, 2048, batch=experts))

    expected = kernel_cost(part(4), h100, cal).seconds + kernel_cost(part(2), h100, cal).seconds
    assert kernel_cost(launched, h100, cal).seconds == pytest.approx(expected)
