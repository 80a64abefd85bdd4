"""gpusim kernel: one kernel predicted beside the measurement of the same case, and the
predictions of cases no fit has seen (the H100's fourth lease, micro-run4.json)."""

from __future__ import annotations

import json
import statistics

import pytest

from gpusim.cli import main
from gpusim.errors import InvalidConfig
from gpusim.hardware.catalog import load_device
from gpusim.measure import results
from gpusim.validate.kernel import attention_case, gemm_case, memory_case, predict_kernel


def test_a_large_gemm_is_predicted_beside_its_measurement() -> None:
    result = predict_kernel(gemm_case(8192, 8192, 8192, "bf16"), load_device("h100-sxm"))
    assert result.measured_s is not None and result.measured_in
    assert abs(result.error or 0) < 0.15
    assert result.bound == "compute" and 0.5 < result.efficiency < 1
    assert result.achieved_tflop_s == pytest.approx(2 * 8192**3 / result.seconds / 1e12)


def test_named_attention_kernels_and_copies() -> None:
    h100 = load_device("h100-sxm")
    shape = (8, 32, 8, 2048, 128, True)
    flash = predict_kernel(attention_case(*shape, "flash2", "forward"), h100)
    cudnn = predict_kernel(attention_case(*shape, "cudnn", "forward"), h100)
    assert cudnn.seconds < flash.seconds
    copy = predict_kernel(memory_case("copy", 2**28), h100)
    assert copy.bound == "memory" and 0.5 < copy.efficiency <= 1
    with pytest.raises(InvalidConfig, match="unknown attention kernel"):
        attention_case(*shape, "flash9", "forward")


def test_held_out_measurements_are_predicted_within_ten_percent() -> None:
    """The fourth H100 lease's GEMMs of at least 1 GFLOP and SDPA cases (never fitted):
    median error within 10%."""
    h100 = load_device("h100-sxm")
    path = results.measurements_dir() / "h100-sxm" / "micro-run4.json"
    errors = []
    for row in json.loads(path.read_text())["cases"]:
        if "median_s" not in row or row.get("graph"):
            continue
        if row["kind"] == "gemm" and 2 * row["m"] * row["n"] * row["k"] >= 1e9:
            case = gemm_case(row["m"], row["n"], row["k"], row["precision"])
        elif row["kind"] == "sdpa" and row["backend"] != "math":
            name = {"flash": "flash2", "cudnn": "cudnn", "efficient": "efficient",
                    "auto": "auto"}[row["backend"]]
            case = attention_case(row["batch"], row["heads"], row["kv_heads"], row["seq"],
                                  row["head_dim"], row["causal"], name, row["pass"])
        else:
            continue
        predicted = predict_kernel(case, h100).seconds
        errors.append(abs(predicted / row["median_s"] - 1))
    assert len(errors) > 100
    assert statistics.median(errors) < 0.10


def test_kernel_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kernel", "--gpu", "h100-sxm", "--op", "gemm", "--m", "4096", "--n", "4096",
                 "--k", "4096", "--precision", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "TFLOP/s" in out and "measured" in out
    assert main(["kernel", "--gpu", "h100-sxm", "--op", "copy", "--bytes", "1000000",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bound"] == "memory" and data["predicted_s"] > 0
    assert main(["kernel", "--gpu", "h100-sxm", "--op", "gemm", "--m", "8"]) == 2
    assert "needs --n, --k" in capsys.readouterr().err


def test_norms_and_activations_as_kernels_beside_their_measurement(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`gpusim kernel --op rms_norm|layer_norm|gelu|silu_mul`: the micro suite's row kernel,
    its measurement shown where the suite timed it; the upcast RMS norm moves its chain's
    passes, under torch.compile the fused form's."""
    from gpusim.validate.kernel import row_case

    h100 = load_device("h100-sxm")
    fused = predict_kernel(row_case("rms_norm", 16384, 4096, "forward"), h100)
    assert fused.measured_s is not None and abs(fused.error or 1.0) < 0.15
    upcast = predict_kernel(row_case("rms_norm", 16384, 4096, "forward", upcast=True), h100)
    compiled = predict_kernel(row_case("rms_norm", 16384, 4096, "forward", True, True), h100)
    assert upcast.bytes == pytest.approx(9 * fused.bytes)  # 18 passes against 2
    assert compiled.bytes == pytest.approx(fused.bytes)
    with pytest.raises(InvalidConfig, match="upcast"):
        row_case("gelu", 16, 1024, "forward", upcast=True)
    assert main(["kernel", "--gpu", "h100-sxm", "--op", "silu_mul", "--rows", "4096",
                 "--cols", "4096", "--pass", "backward"]) == 0
    assert "kernel/silu_mul/4096x4096/backward" in capsys.readouterr().out


def test_collectives_as_kernels(capsys: pytest.CaptureFixture[str]) -> None:
    """`gpusim kernel --op allreduce ...`: a collective over --gpus ranks of a system, its
    algorithm and nccl-tests' bus bandwidth (within 5% of the published 8-GPU NVLS figure,
    480 GB/s, that benchmarks/collectives.py compares)."""
    assert main(["kernel", "--system", "dgx-h100", "--op", "allreduce", "--gpus", "8",
                 "--bytes", str(8 * 2**30), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["algorithm"] == "nvls" and out["bus_bw_gb_s"] == pytest.approx(480, rel=0.05)
    assert main(["kernel", "--gpu", "h100-sxm", "--op", "alltoall", "--gpus", "16",
                 "--bytes", "1073741824"]) == 0
    assert "all_to_all" in capsys.readouterr().out
    assert main(["kernel", "--gpu", "h100-sxm", "--op", "allgather", "--gpus", "1",
                 "--bytes", "1024"]) == 2
    assert main(["kernel", "--op", "gemm", "--m", "8", "--n", "8", "--k", "8"]) == 2


def test_fp32_attention_as_a_kernel_beside_its_measurements() -> None:
    """SDPA on fp32 inputs is the memory-efficient kernel's: SDPA's choice and the named
    efficient kernel cost the same, each found beside its measurement (the H200's suite run,
    held out of the Hopper fit; the H100's probe rows, fitted), and a 16-bit-only kernel is
    refused with what would work."""
    h200 = load_device("h200")
    shape = (4, 16, 16, 1024, 64, True)
    auto = predict_kernel(attention_case(*shape, "auto", "backward", "fp32"), h200)
    named = predict_kernel(attention_case(*shape, "efficient", "backward", "fp32"), h200)
    assert auto.seconds == pytest.approx(named.seconds)
    assert auto.measured_in == "measurements/h200/micro-run2.json"
    assert auto.error is not None and abs(auto.error) < 0.25
    h100 = predict_kernel(attention_case(4, 16, 16, 1024, 64, False, "efficient", "forward",
                                         "fp32"), load_device("h100-sxm"))
    assert h100.measured_in == "measurements/h100-sxm/micro-sdpa32.json"
    assert h100.error is not None and abs(h100.error) < 0.1
    with pytest.raises(InvalidConfig, match="16-bit inputs only"):
        attention_case(*shape, "flash2", "forward", "fp32")
    with pytest.raises(InvalidConfig, match="SDPA takes"):
        attention_case(*shape, "auto", "forward", "fp8")


def test_a_published_figure_of_the_same_kernel_stands_beside_the_prediction() -> None:
    """Where the project has not measured a case on the device, a published figure of the
    same kernel (measurements/published/<device>/micro.json, matched by shape, not by id)
    is shown with its source, and compared with the device's own time, as it was timed."""
    v100 = load_device("v100-sxm2-16gb")
    found = predict_kernel(gemm_case(16, 512, 512, "fp16"), v100)
    assert found.measured_kernel_only and found.measured_s is not None
    assert found.measured_in is not None and "DeepBench" in found.measured_in
    assert found.error == pytest.approx(found.kernel_seconds / found.measured_s - 1)
    h100 = load_device("h100-sxm")
    fa3 = predict_kernel(attention_case(16, 32, 32, 1024, 64, False, "cudnn", "forward",
                                        "fp16"), h100)
    assert fa3.measured_kernel_only and "FlashAttention-3" in (fa3.measured_in or "")
    own = predict_kernel(gemm_case(8192, 8192, 8192, "bf16"), h100)  # the project's own
    assert own.measured_s is not None and not own.measured_kernel_only
    assert predict_kernel(gemm_case(8191, 8191, 8191, "bf16"), h100).measured_s is None
