"""Calibration fits the micro suite and nothing else, and the committed fits are reproducible."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusim.calibrate import fit
from gpusim.calibrate.micro_ops import predict
from gpusim.errors import InvalidMeasurement
from gpusim.hardware.calibration import calibration_for, load_calibration_file
from gpusim.hardware.catalog import load_device, profiles_dir
from gpusim.measure import results

MEASURED = sorted(results.measurements_dir().glob("*/micro.json"))


@pytest.fixture(scope="module", params=MEASURED, ids=lambda p: p.parent.name)
def fitted(request: pytest.FixtureRequest) -> fit.FitResult:
    return fit.fit(request.param)


def test_there_is_measured_micro_data() -> None:
    assert MEASURED, "measurements/<device>/micro.json should be committed"


def test_fit_improves_every_group(fitted: fit.FitResult) -> None:
    assert fitted.calibration.status == "fitted"
    for group in fitted.groups:
        # The fit minimizes the mean |log| error, which never gets worse; the mean relative
        # error it reports can end a fraction of a point higher where the group started near
        # its optimum (a named attention kernel starts from the default kernel's fit), or
        # higher still where the log error fell (a CPU's bf16 convolutions, some of which
        # oneDNN runs on AMX and some not, scatter both ways of any one factor).
        assert group.log_error_after <= group.log_error_before + 1e-9, group
        assert (group.error_after <= group.error_before + 0.005
                or group.log_error_after < group.log_error_before - 0.005), group


FITTED = [p for p in sorted((profiles_dir() / "calibration").glob("*.yaml"))
          if load_calibration_file(p).status == "fitted"]


@pytest.mark.parametrize("path", FITTED, ids=lambda p: p.stem)
def test_committed_calibration_is_the_fit_of_the_committed_micro_suite(path: Path) -> None:
    """No hand tuning: re-running the fit on the files it names reproduces the committed
    file's figures (for a device, or for its whole architecture)."""
    committed = load_calibration_file(path)
    root = results.measurements_dir().parent
    result = fit.fit([root / source for source in committed.fitted_on],
                     bound_by=[root / source for source in committed.bounded_by])
    if committed.architecture is not None:
        result = fit.for_architecture(result)
    fresh = fit.rounded(result.calibration.model_dump(exclude={"rationale"}))
    assert committed.model_dump(exclude={"rationale"}) == fresh


def test_every_micro_suite_with_a_fit_is_used_by_one() -> None:
    used = {source for p in FITTED for source in load_calibration_file(p).fitted_on}
    for micro in MEASURED:
        device = micro.parent.name
        if any(s.startswith(f"measurements/{device}/") for s in used):
            assert results.display_path(micro) in used, micro


def test_no_models_suite_data_enters_a_fit(tmp_path: Path) -> None:
    """The fit refuses a models file, and a micro file fits the same with or without the
    models file beside it (or with that file scrambled)."""
    micro = MEASURED[0]
    models = micro.parent / "models.json"
    with pytest.raises(InvalidMeasurement, match="micro suite"):
        fit.fit(models if models.exists() else micro.with_name("nope.json"))
    alone = tmp_path / "measurements" / micro.parent.name / "micro.json"
    alone.parent.mkdir(parents=True)
    shutil.copy(micro, alone)
    first = fit.fit(alone).calibration
    scrambled = {"schema_version": 1, "suite": "models", "device": micro.parent.name,
                 "provenance": {}, "cases": [{"id": "x", "step": {"median_s": 1e9}}]}
    (alone.parent / "models.json").write_text(json.dumps(scrambled))
    assert fit.fit(alone).calibration == first
    assert fit.fit(micro).calibration.model_dump(exclude={"rationale"}) == \
        first.model_dump(exclude={"rationale"})


def test_quick_runs_are_not_calibrated_from(tmp_path: Path) -> None:
    data = json.loads(MEASURED[0].read_text())
    data["quick"] = True
    path = tmp_path / "micro.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InvalidMeasurement, match="quick"):
        fit.fit(path)


def test_calibration_file_names_no_machine_path() -> None:
    for path in (profiles_dir() / "calibration").glob("*.yaml"):
        data = yaml.safe_load(path.read_text())
        for source in data.get("fitted_on", []):
            assert source.startswith("measurements/"), source


def test_micro_predictions_follow_the_roofline() -> None:
    """Bigger GEMMs take longer; a GEMM at the fitted efficiency is never faster than peak."""
    device = load_device("epyc-zen4-2vcpu")
    cal = calibration_for(device)
    times = [predict({"kind": "gemm", "id": "g", "precision": "fp32", "m": s, "n": s, "k": s},
                     device, cal) for s in (64, 256, 1024)]
    assert times == sorted(times)
    peak_time = 2 * 1024**3 / device.peak_flops("fp32", matrix=True)[0]
    assert times[-1] > peak_time


@pytest.mark.parametrize(("text", "message"), [
    ('{"schema_version": 1, "suite": "micro", "device": "h100-sxm", "provenance": {}, '
     '"cases": [{"id": "g", "kind": "gemm", "median_s": NaN}]}', "not a number"),
    ('{"schema_version": 1, "suite": "micro", "device": "h100-sxm", "provenance": {}, '
     '"cases": [{"id": "g", "kind": "gemm", "median_s": -1}]}', "positive number"),
    ('{"schema_version": 1, "suite": "micro", "device": "h100-sxm", "provenance": {}, '
     '"cases": [{"kind": "gemm"}]}', "string id and kind"),
    ('{"schema_version": 1, "suite": "micro", "device": "h100-sxm", "provenance": {}, '
     '"cases": {}}', "must be a list"),
    ("\xff\xfe", "not a readable JSON"),
])
def test_bad_measurement_files_are_refused_by_name(tmp_path: Path, text: str,
                                                   message: str) -> None:
    path = tmp_path / "micro.json"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(InvalidMeasurement, match=message):
        fit.fit(path)


def test_a_measurement_path_must_be_a_small_regular_file(tmp_path: Path) -> None:
    import os

    with pytest.raises(InvalidMeasurement, match="not a regular file"):
        results.load(tmp_path)
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(InvalidMeasurement, match="not a regular file"):
        results.load(fifo)  # would block forever if it were opened
    huge = tmp_path / "huge.json"
    with huge.open("wb") as f:
        f.truncate(results.LARGEST_FILE + 1)  # sparse: no disk used
    with pytest.raises(InvalidMeasurement, match="far larger"):
        results.load(huge)


def test_a_bound_from_another_device_is_refused_by_name() -> None:
    """--bound-by takes searched maxima of the device the fit measures, not another's."""
    root = results.measurements_dir()
    with pytest.raises(InvalidMeasurement, match="--bound-by"):
        fit.fit([root / "h100-sxm" / "micro.json"],
                bound_by=[root / "published" / "a100-80gb" / "micro.json"])


def test_a_norm_written_in_upcasting_ops_is_a_family_of_its_own() -> None:
    """A norm written as separate upcasting ops runs a chain of plain kernels, not the norm's
    own kernel: its factor is fitted apart (rms_norm_upcast), each form standing for the
    other until both are measured; a compiled case measures TorchInductor's kernel over
    the fused form's passes (family rms_norm_compiled, the fused form's factor until
    measured)."""
    from gpusim.calibrate.micro_ops import predict, row_family
    from gpusim.hardware.calibration import MemoryCalibration
    from gpusim.hardware.catalog import load_device

    h100 = load_device("h100-sxm")
    base = {"id": "x", "kind": "row_kernel", "op": "rms_norm", "rows": 16384, "cols": 4096,
            "precision": "bf16", "pass": "forward"}
    upcast, compiled = {**base, "upcast": "cast_back"}, {**base, "upcast": "cast_back",
                                                         "compiled": True}
    assert [row_family(c, h100) for c in (base, upcast, compiled)] == \
        ["rms_norm", "rms_norm_upcast", "rms_norm_compiled"]
    memory = MemoryCalibration(max_efficiency=0.9, ramp_us=0.0,
                               kernel_factors={"rms_norm": 0.6})
    assert memory.kernel_factor("rms_norm_upcast") == 0.6  # the fused form stands for it
    both = memory.model_copy(update={"kernel_factors": {"rms_norm": 0.6,
                                                        "rms_norm_upcast": 0.8}})
    assert (both.kernel_factor("rms_norm_upcast"), both.kernel_factor("rms_norm")) == (0.8, 0.6)
    assert memory.kernel_factor("gelu") == 1.0
    assert memory.kernel_factor("rms_norm_compiled") == 0.6  # Inductor's, until measured
    assert both.model_copy(update={"kernel_factors": {
        **both.kernel_factors, "rms_norm_compiled": 0.7}}).kernel_factor(
            "rms_norm_compiled") == 0.7
    cal = calibration_for(h100)
    # the chain moves 18 passes over the tensor, the generated kernel 2
    assert predict(upcast, h100, cal) > 5 * predict(compiled, h100, cal)


def test_the_micro_suite_times_upcast_norms_and_compiled_kernels_on_cuda() -> None:
    import torch

    from gpusim.measure.runner import _row_kernel_cases

    ids = [c["id"] for c, _ in _row_kernel_cases(torch.device("cpu"), True, 64e6, 1e6)]
    assert any(i.startswith("kernel/rms_norm-upcast/") for i in ids)
    assert not any("compiled" in i for i in ids)  # Inductor's CPU kernels calibrate nothing


def test_loop_timed_small_products_fit_the_host_cost_alone() -> None:
    """Where CUDA-graph replays time small products on the device, the small ones timed in
    a Python loop (the host's pace) fit cublas_us and scaled_mm_us only, never the ramp or
    an efficiency; without replays (published figures) one group fits everything."""
    from gpusim.calibrate.groups import device_paced, fit_groups
    from gpusim.cost.kernels import op_host_extra
    from gpusim.workload.ops import GemmShape, gemm_op

    h100 = load_device("h100-sxm")
    cases = results.load(results.measurements_dir() / "h100-sxm" / "micro.json",
                         suite="micro")["cases"]
    groups = {name: (members, [".".join(p) for p, _ in params])
              for name, members, params in fit_groups(cases, h100)}
    device, device_params = groups["gemm"]
    host, host_params = groups["gemm host"]
    assert any(c.get("graph") for c in device) and host
    assert all(c.get("graph") or device_paced(c) for c in device)
    # a short-K product that writes 128 MiB is the device's pace, not the host's
    assert any(c["id"] == "gemm/bf16/8192x8192x64" for c in device)
    assert not any(c.get("graph") for c in host)
    assert "gemm.ramp_us" in device_params and "overhead.cublas_us" not in device_params
    assert host_params == ["overhead.cublas_us", "overhead.scaled_mm_us"]

    looped = [c for c in cases if c["kind"] == "gemm" and not c.get("graph")]
    (_, _, params), = [g for g in fit_groups(looped, h100) if g[0] == "gemm"]
    assert "overhead.cublas_us" in {".".join(p) for p, _ in params}

    cal = calibration_for(h100)
    shape = GemmShape(4096, 4096, 4096)
    bf16, fp8 = gemm_op("g", shape, "bf16", 2), gemm_op("g", shape, "fp8", 1)
    assert cal.overhead.scaled_mm_us > 0
    assert op_host_extra(fp8, cal) - op_host_extra(bf16, cal) == pytest.approx(
        cal.overhead.scaled_mm_us * 1e-6)


def test_a_suite_convolution_under_autocast_pays_its_casts() -> None:
    """The suite runs 16-bit convolutions under autocast on an fp32 input and module: the
    input and weight casts (in backward, their gradients' casts back) are kernels of the
    case; a published figure of the same convolution times the cuDNN call alone."""
    from gpusim.calibrate.micro_ops import case_ops

    h100 = load_device("h100-sxm")
    shape = {"kind": "conv", "batch": 32, "in_channels": 64, "out_channels": 64,
             "kernel": 3, "height": 56, "width": 56, "stride": 1, "padding": 1, "bias": 0}
    names = {(prec, pas): [op.name.rsplit(".", 1)[-1] for op in case_ops(
        {**shape, "id": f"conv/{prec}/{pas}", "precision": prec, "pass": pas}, h100)]
        for prec in ("fp32", "bf16") for pas in ("forward", "backward")}
    assert names["bf16", "forward"][:2] == ["cast_input", "cast_weight"]
    assert names["bf16", "backward"][-2:] == ["cast_input_grad", "cast_weight_grad"]
    assert not any("cast" in n for n in names["fp32", "forward"] + names["fp32", "backward"])
    published = case_ops({**shape, "id": "published/x", "precision": "bf16",
                          "pass": "forward", "source": "x"}, h100)
    assert not any("cast" in op.name for op in published)


def test_attention_rates_move_with_sequence_length_and_head_dimension() -> None:
    """A fused attention kernel pays fixed work per block of queries (short sequences run
    below long ones) and a softmax that does not grow with the head dimension (d 64 below
    128): both fitted where the cases span them, the factor being the rate at 32 key blocks
    of d 128, which neither moves."""
    from gpusim.calibrate.groups import fit_groups
    from gpusim.cost.kernels import REFERENCE_KEY_BLOCKS, kernel_cost, key_blocks_per_query_block
    from gpusim.workload.attention import Attention
    from gpusim.workload.numerics import Numerics
    from gpusim.workload.ops import AttentionShape

    bf16 = Numerics("bf16", "bf16", "bf16")

    assert key_blocks_per_query_block(AttentionShape(1, 4096, 4096, False)) == 32
    assert key_blocks_per_query_block(AttentionShape(1, 4096, 4096, True)) == 16.5
    assert key_blocks_per_query_block(AttentionShape(1, 8192, 8192, False, window=1024)) == 9

    h100 = load_device("h100-sxm")
    cal = calibration_for(h100)
    assert cal.attention_overhead("cudnn") > 0 and cal.attention_width("cudnn") > 0
    bare = cal.model_copy(update={"gemm": cal.gemm.model_copy(update={
        "attention_tile_overhead": {}, "attention_softmax_width": {}})})

    def rate(seq: int, d: int, c: Any) -> float:
        att = Attention("a", 16, d, seq, causal=False, fused=True, kernel="cudnn")
        op = next(o for o in att.forward(1, bf16) if o.kind == "attention")
        return op.flops / kernel_cost(op, h100, c).compute_s

    reference = REFERENCE_KEY_BLOCKS * 128
    assert rate(reference, 128, cal) == pytest.approx(rate(reference, 128, bare))
    assert rate(1024, 128, cal) < rate(reference, 128, cal) < rate(32768, 128, cal)
    assert rate(reference, 64, cal) < rate(reference, 128, cal)

    cases = results.load(results.measurements_dir() / "h100-sxm" / "micro.json",
                         suite="micro")["cases"]
    params = {".".join(p) for name, _, ps in fit_groups(cases, h100) for p, _ in ps
              if name == "attention cudnn"}
    assert {"gemm.attention_tile_overhead.cudnn", "gemm.attention_softmax_width.cudnn"} <= params
    single = [c for c in cases if c.get("seq") == 4096]
    assert not any("overhead" in ".".join(p) for _, _, ps in fit_groups(single, h100)
                   for p, _ in ps)


def test_the_attention_curve_is_not_carried_past_the_fitted_lengths() -> None:
    """Past the longest sequence (and the widest head) a kernel's terms were fitted on, its
    rate is that length's: the saturating curves are held flat rather than extrapolated."""
    from gpusim.cost.kernels import kernel_cost
    from gpusim.workload.attention import Attention
    from gpusim.workload.numerics import Numerics

    h100 = load_device("h100-sxm")
    cal = calibration_for(h100)
    longest = cal.attention_longest("cudnn")
    assert longest is not None and 16 <= longest <= 64  # the suite's SDPA runs reach 8K

    def rate(seq: int) -> float:
        att = Attention("a", 16, 128, seq, causal=False, fused=True, kernel="cudnn")
        op = next(o for o in att.forward(1, Numerics("bf16", "bf16", "bf16"))
                  if o.kind == "attention")
        return op.flops / kernel_cost(op, h100, cal).compute_s

    edge = 128 * math.ceil(longest)  # whole blocks (no partial tile), past the longest
    assert rate(edge // 4) < rate(edge)
    assert rate(4 * edge) == pytest.approx(rate(edge), rel=1e-3)

    # likewise the head dimension: the suite timed 64 and 128, so 256 runs at 128's rate
    assert cal.attention_widest("cudnn") == 128

    def per_flop(d: int) -> float:
        att = Attention("a", 16, d, 4096, causal=False, fused=True, kernel="cudnn")
        op = next(o for o in att.forward(1, Numerics("bf16", "bf16", "bf16"))
                  if o.kind == "attention")
        return op.flops / kernel_cost(op, h100, cal).compute_s

    assert per_flop(64) < per_flop(128) == pytest.approx(per_flop(256), rel=1e-9)


def test_the_h100_fit_predicts_the_h200s_short_k_products() -> None:
    """The exposed write is fitted on the H100 alone; the H200's 16-bit short-K products
    (never fitted, 43% more bandwidth) are predicted within 10%, where the plain roofline
    came out 9-28% fast."""
    h200 = load_device("h200")
    cal = calibration_for(h200)
    assert cal.name == "hopper-fitted-on-h100-sxm"
    cases = results.load(results.measurements_dir() / "h200" / "micro.json",
                         suite="micro")["cases"]
    short = [c for c in cases if c["kind"] == "gemm" and c["precision"] in ("bf16", "fp16")
             and (c["m"], c["n"], c["k"]) in {(8192, 8192, 64), (2048, 16384, 256),
                                              (4096, 3072, 768)}]
    assert len(short) == 6
    for case in short:
        assert predict(case, h200, cal) / case["median_s"] - 1 == pytest.approx(0, abs=0.10)


# The H200's GEMMs that the device paces (graph replays, or loop-timed past 40 us),
# predicted from the H100's fit with no H200 data in it: 8.3% mean error before the
# result write was modelled, 6.2% with it and fp8's byte counts (2026-11-24). The
# cross-GPU test of issue 15; only ever tightened.
H200_GEMM_MAPE_BUDGET = 0.066


def test_the_h100_fit_predicts_the_h200s_gemms_within_budget() -> None:
    from gpusim.calibrate.micro_ops import kernel_timed

    h200 = load_device("h200")
    cal = calibration_for(h200)
    cases = [c for c in results.load(results.measurements_dir() / "h200" / "micro.json",
                                     suite="micro")["cases"]
             if c["kind"] == "gemm" and (kernel_timed(c) or c["median_s"] >= 40e-6)]
    assert len(cases) >= 60
    errors = [abs(predict(c, h200, cal) / c["median_s"] - 1) for c in cases]
    assert sum(errors) / len(errors) <= H200_GEMM_MAPE_BUDGET


def test_products_sustained_for_a_step_run_at_the_power_limits_clock() -> None:
    """The fit takes a sustained_gemm case's steady state over the same product's burst
    (gemm.sustained_factor); a training step's plan costs tensor-core products at that rate,
    fp32 ones and the micro suite's bursts as fitted."""
    from gpusim.calibrate.fit import _fit_sustained
    from gpusim.hardware.catalog import load_device
    from gpusim.plan.job import TrainingJob
    from gpusim.plan.lower import lower
    from gpusim.workload import zoo

    shape = {"precision": "bf16", "m": 8192, "n": 8192, "k": 8192}
    run = {"cases": [{"kind": "gemm", "median_s": 1.5e-3, **shape},
                     {"kind": "sustained_gemm", "median_s": 1.6e-3, **shape}]}
    cal: dict[str, Any] = {"gemm": {}}
    assert "0.9375" in _fit_sustained(cal, [run])
    assert cal["gemm"]["sustained_factor"] == 0.9375
    assert _fit_sustained({"gemm": {}}, [{"cases": run["cases"][:1]}]) == ""

    h100 = load_device("h100-sxm")
    fitted = calibration_for(h100)
    factor = fitted.gemm.sustained_factor
    assert 0.9 < factor < 1.0  # the H100's own sustained case
    step = fitted.sustained()
    assert step.gemm_efficiency("bf16") == pytest.approx(factor * fitted.gemm_efficiency("bf16"))
    assert step.gemm_efficiency("fp32") == fitted.gemm_efficiency("fp32")
    assert step.sustained() is step and fitted.sustained() is step
    job = TrainingJob(zoo.get("gpt2"), h100, 8, "bf16")
    burst = lower(job, fitted.model_copy(update={"gemm": fitted.gemm.model_copy(
        update={"sustained_factor": 1.0})}))
    sustained = lower(job, fitted)
    assert sum(k.device_s for k in sustained.microbatch) > sum(
        k.device_s for k in burst.microbatch)


def test_the_fp32_attention_micro_file_is_the_conversion_of_the_committed_probes() -> None:
    """micro-sdpa32.json is derived, never edited: converting the GPU probes' fp32 SDPA
    rows again gives the committed file, the efficient backend's rows only, each shape's
    forward and forward with backward."""
    from gpusim.measure import probe_cases

    folder = results.measurements_dir() / "h100-sxm"
    fresh = probe_cases.convert_file(folder / "probes.json")
    committed = json.loads((folder / probe_cases.OUTPUT_NAME).read_text())
    assert committed == fresh
    assert {c["backend"] for c in fresh["cases"]} == {"efficient"}
    assert {c["pass"] for c in fresh["cases"]} == {"forward", "forward_backward"}
    assert len(fresh["cases"]) == 10
