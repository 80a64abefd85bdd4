"""The terms the H100 and H200 measurements added to the model: each is what real PyTorch
steps pay, found in a profile and fitted on micro data (measurements/README.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpusim.cost.kernels import kernel_cost
from gpusim.hardware.calibration import calibration_for
from gpusim.hardware.catalog import load_device, load_gpu
from gpusim.hardware.profile import DeviceProfile
from gpusim.measure import results
from gpusim.plan.autocast import layer_precisions
from gpusim.plan.job import TrainingJob
from gpusim.plan.lower import lower
from gpusim.plan.memory import memory_plan
from gpusim.validate.compare import validate_file
from gpusim.workload import zoo
from gpusim.workload.layers import Conv2d, Linear
from gpusim.workload.numerics import Numerics
from gpusim.workload.ops import GemmShape
from gpusim.workload.zoo.transformer import TransformerConfig, build_transformer

BF16 = Numerics("bf16", "bf16", "bf16")


def test_rows_not_16_byte_multiples_are_misaligned() -> None:
    assert GemmShape(4096, 4096, 4096).aligned(2)
    assert not GemmShape(4096, 50257, 768).aligned(2)  # GPT-2's vocabulary as N
    assert GemmShape(50257, 768, 4096).aligned(2)  # as M: no stored row is 50257 long
    assert not GemmShape(768, 768, 8192, row_lengths=(768, 50257)).aligned(2)
    assert GemmShape(1000, 1000, 1000).aligned(2) and not GemmShape(1001, 1001, 1001).aligned(2)


def test_a_misaligned_vocabulary_gemm_is_slower_than_a_padded_one(h100: DeviceProfile) -> None:
    cal = calibration_for(h100)
    vocab = Linear("head", 768, 50257, rows=1024)
    padded = Linear("head", 768, 50304, rows=1024)  # nanoGPT's padding to a multiple of 64
    for ops in (lambda la: la.forward(8, BF16), lambda la: la.backward_input(8, BF16),
                lambda la: la.backward_weight(8, BF16)):
        odd = sum(kernel_cost(op, h100, cal).seconds for op in ops(vocab))
        even = sum(kernel_cost(op, h100, cal).seconds for op in ops(padded))
        assert odd > 2 * even


def test_tensor_core_convolutions_transpose_nchw_and_fp32_cpu_ones_do_not() -> None:
    conv = Conv2d("c", 64, 64, 3, 56, 56, 1, 1)
    names = [op.name for op in conv.forward(32, BF16) + conv.backward_input(32, BF16)]
    assert names == ["c.to_nhwc", "c.fwd", "c.dgrad_to_nhwc", "c.dgrad"]
    assert [op.name for op in conv.forward(32, Numerics())] == ["c.fwd"]


def test_autocast_keeps_a_transformers_residual_stream_in_fp32(h100: DeviceProfile) -> None:
    gpt = build_transformer(TransformerConfig(layers=2, hidden=256, heads=4, vocab=1000,
                                              seq_len=64))
    job = TrainingJob(gpt, h100, 2, "bf16", loader_workers=0)
    prec = layer_precisions(job)
    assert prec["h.0.norm1"].numerics.activation == "fp32"
    assert prec["h.0.attn.add"].numerics.activation == "fp32"
    assert prec["h.0.attn.qkv"].casts_input  # after an fp32 norm
    assert not prec["h.0.attn.proj"].casts_input  # after the bf16 attention core
    assert prec["h.0.mlp.act"].numerics.activation == "bf16"
    names = {k.name for k in lower(job).microbatch}
    assert {"h.0.attn.qkv.cast_input", "h.0.attn.qkv.cast_input_grad"} <= names
    # A CNN's stream stays 16-bit; fp32 training has one type and casts nothing.
    resnet = TrainingJob(zoo.get("resnet50"), h100, 8, "bf16", loader_workers=0)
    assert {p.numerics.activation for n, p in layer_precisions(resnet).items()
            if "bn" in n} == {"bf16"}
    full = layer_precisions(TrainingJob(gpt, h100, 2, "fp32", loader_workers=0))
    assert not any(p.casts_input for p in full.values())


def test_peak_memory_counts_cublas_workspaces_on_gpus_only(h100: DeviceProfile) -> None:
    mlp = zoo.get("mnist-mlp")
    on_gpu = memory_plan(TrainingJob(mlp, h100, 64, "fp32", loader_workers=0))
    assert on_gpu.library_workspaces == 64 * 2**20  # two 32 MiB workspaces on Hopper
    a100 = memory_plan(TrainingJob(mlp, load_gpu("a100-80gb"), 64, "fp32", loader_workers=0))
    assert a100.library_workspaces == 8 * 2**20
    cpu = load_device("epyc-zen4-2vcpu")
    assert memory_plan(TrainingJob(mlp, cpu, 64, "fp32", loader_workers=0)
                       ).library_workspaces == 0


def test_default_gpu_calibrations_take_the_measured_host_costs(h100: DeviceProfile) -> None:
    hopper = calibration_for(h100)
    ampere = calibration_for(load_gpu("a100-80gb"))
    # Ampere is fitted on published kernel figures, which say nothing of the host
    assert hopper.status == "fitted" and ampere.host_overhead_from == "hopper"
    assert ampere.overhead.layer_us == hopper.overhead.layer_us
    assert ampere.overhead.cublas_us == hopper.overhead.cublas_us
    assert ampere.overhead.kernel_us == 2.0  # device-side: the Ampere file's own
    assert calibration_for(load_device("epyc-zen4-2vcpu")).host_overhead_from is None


def test_each_layer_pays_its_kinds_host_cost(h100: DeviceProfile) -> None:
    cal = calibration_for(h100)
    plan = lower(TrainingJob(zoo.get("mnist-mlp"), h100, 64, "fp32", loader_workers=0))
    first = next(k for k in plan.microbatch if k.layer == "fc2" and k.phase == "forward")
    assert first.host_s * 1e6 >= cal.overhead.module_us + cal.overhead.layer_us["linear"]
    # torch.optim's step: its fixed and per-tensor host cost spread over its kernels
    extra = sum(k.host_s for k in plan.optimizer) * 1e6
    assert extra >= cal.overhead.optimizer_us + 6 * cal.overhead.optimizer_tensor_us


@pytest.mark.parametrize("device", ["h100-sxm", "h200"])
def test_validation_tells_device_bound_from_host_bound_cases(device: str) -> None:
    from gpusim.measure import results
    report = validate_file(results.measurements_dir() / device / "models.json")
    by_id = {r.id: r for r in report.rows}
    assert by_id["mnist-mlp/fp32/b64"].host_bound
    assert not by_id["llama-blocks/s2048/bf16/b2"].host_bound
    split = report.to_dict()
    assert split["device_bound"]["cases"] + split["host_bound"]["cases"] == len(report.rows)


def test_a_linear_layers_products_carry_their_layouts(h100: DeviceProfile) -> None:
    """Forward x W^T (nt), input gradient dy W (nn), weight gradient dy^T x (tn): a fitted
    layout factor slows exactly the products stored that way."""
    layer = Linear("up", 4096, 14336, 4096, bias=False)
    num = Numerics("bf16", "bf16", "bf16")
    fwd, dgrad, wgrad = (*layer.forward(1, num), *layer.backward_input(1, num),
                         *layer.backward_weight(1, num))
    assert [op.gemm.layout for op in (fwd, dgrad, wgrad) if op.gemm] == ["nt", "nn", "tn"]
    cal = _main_loop_alone(calibration_for(h100))
    slow = cal.model_copy(update={"gemm": _replace_gemm(cal, {"tn": 0.5})})
    for op in (fwd, dgrad):
        assert kernel_cost(op, h100, slow).seconds == kernel_cost(op, h100, cal).seconds
    assert kernel_cost(wgrad, h100, slow).compute_s == pytest.approx(
        2 * kernel_cost(wgrad, h100, cal).compute_s)


def _replace_gemm(cal: Any, factors: dict[str, float]) -> Any:
    """The GEMM calibration with these layouts' factors replaced (the others kept)."""
    return cal.gemm.model_copy(update={"layout_factors": {**cal.gemm.layout_factors,
                                                          **factors}})


def _main_loop_alone(cal: Any) -> Any:
    """The calibration without the result write's exposed share, which adds to a product's
    time apart from its rate (tests/test_cost.py checks that term)."""
    return cal.model_copy(update={"gemm": cal.gemm.model_copy(
        update={"epilogue_exposed": 0.0})})


def test_calibration_fits_layout_factors_on_linear_cases(tmp_path: Path) -> None:
    """Linear cases whose backward runs 25% slower than the row-major GEMMs predict: the
    fit finds the weight gradient's (tn) layout slower and leaves the forward's (nt)."""
    from gpusim.calibrate import fit
    from gpusim.calibrate.micro_ops import predict

    h100 = load_device("h100-sxm")
    source = json.loads((results.measurements_dir() / "h100-sxm" / "micro.json").read_text())
    gemms = [c for c in source["cases"] if c["kind"] in ("gemm", "launch", "dispatch")
             and "median_s" in c and c.get("precision") in (None, "bf16")]
    cal = calibration_for(h100)
    linear = []
    for tokens, i, o in ((16384, 4096, 14336), (16384, 14336, 4096), (16384, 4096, 6144)):
        for phase, scale in (("forward", 1.0), ("backward", 1.25)):
            case = {"id": f"linear/bf16/{tokens}x{i}x{o}/{phase}", "kind": "linear",
                    "precision": "bf16", "tokens": tokens, "in_features": i,
                    "out_features": o, "pass": phase, "p10_s": 0, "p90_s": 0,
                    "repeats": 30, "inner": 1}
            case["median_s"] = scale * predict(case, h100, cal)
            case["p10_s"] = case["p90_s"] = case["median_s"]
            linear.append(case)
    path = tmp_path / "micro.json"
    path.write_text(json.dumps({**source, "cases": gemms + linear}))
    fitted = fit.fit([path]).calibration.gemm.layout_factors
    assert fitted["nt"] > 0.9 and fitted["tn"] < 0.75


def test_a_long_inner_dimension_runs_below_the_knees_rate(h100: DeviceProfile) -> None:
    """Past the knee, a product's rate falls as (knee / K) ** slope; up to it, and for a
    precision with no slope, nothing changes."""
    cal = _main_loop_alone(calibration_for(h100))
    gemm = cal.gemm.model_copy(update={"long_k_slope": {"bf16": 0.1}, "long_k_knee": 4096})
    sloped = cal.model_copy(update={"gemm": gemm})
    flat = cal.model_copy(update={"gemm": cal.gemm.model_copy(update={"long_k_slope": {}})})

    def compute_s(k: int, c: Any, math: str = "bf16") -> float:
        # a linear layer's forward runs over its input features: K = k
        ops = Linear("l", k, 8192, rows=8192).forward(1, Numerics(math, math, math))
        return sum(kernel_cost(op, h100, c).compute_s for op in ops if op.gemm)

    assert compute_s(4096, sloped) == compute_s(4096, flat)
    assert compute_s(8192, sloped) == pytest.approx(2 ** 0.1 * compute_s(8192, flat))
    assert compute_s(8192, sloped, "fp16") == compute_s(8192, flat, "fp16")


def test_calibration_fits_the_long_k_slope_from_gemm_cases(tmp_path: Path) -> None:
    """bf16 GEMMs timed as if their rate fell by 12% per doubling of K past 4096: the fit
    finds a slope near log2(1 / 0.88) and leaves a precision whose cases do not span the
    knee without one."""
    from gpusim.calibrate import fit
    from gpusim.calibrate.micro_ops import predict

    h100 = load_device("h100-sxm")
    source = json.loads((results.measurements_dir() / "h100-sxm" / "micro.json").read_text())
    cal = calibration_for(h100)
    truth = cal.model_copy(update={"gemm": cal.gemm.model_copy(
        update={"long_k_slope": {"bf16": 0.184}})})
    cases = []
    for c in source["cases"]:
        if c["kind"] in ("launch", "dispatch") and "median_s" in c:
            cases.append(c)
        elif c["kind"] == "gemm" and c.get("precision") in ("bf16", "tf32") \
                and c["id"].startswith("gemm/") and "median_s" in c:
            t = predict(c, h100, truth)
            cases.append({**c, "median_s": t, "p10_s": t, "p90_s": t})
    path = tmp_path / "micro.json"
    path.write_text(json.dumps({**source, "cases": cases}))
    slopes = fit.fit([path]).calibration.gemm.long_k_slope
    assert slopes["bf16"] == pytest.approx(0.184, rel=0.15)
    assert slopes.get("tf32", 0.0) < 0.02
