"""Published microbenchmarks become micro-suite files that calibration fits like its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpusim.calibrate import fit
from gpusim.calibrate.micro_ops import predict
from gpusim.errors import InvalidMeasurement
from gpusim.hardware.calibration import stated_defaults
from gpusim.hardware.catalog import load_gpu, read_yaml
from gpusim.measure import published, results

TRANSCRIBED = sorted((results.measurements_dir() / "published").glob("*/transcribed.yaml"))

SOURCE = {"id": "paper", "title": "a paper", "url": "https://example.org/paper",
          "where": "Table 1"}


def _transcription(*rows: dict) -> dict:
    return {"device": "a100-80gb", "collected": "2026-11-23", "sources": [SOURCE],
            "rows": [{"source": "paper", **r} for r in rows]}


def test_figures_become_times_as_their_sources_count_them() -> None:
    data, skipped = published.convert(_transcription(
        {"kind": "gemm", "precision": "bf16", "m": 8192, "n": 8192, "k": 8192, "tflops": 250},
        {"kind": "sdpa", "backend": "flash", "precision": "bf16", "batch": 8, "heads": 16,
         "seq": 2048, "head_dim": 128, "causal": True, "pass": "backward", "tflops": 100},
        {"kind": "memory", "op": "triad", "dtype": "fp64", "bytes_per_array": 2**28,
         "gb_s": 1500},
        {"kind": "sdpa", "backend": "flash3", "precision": "bf16", "batch": 8, "heads": 16,
         "seq": 2048, "head_dim": 128, "causal": False, "pass": "forward", "tflops": 600},
    ), "t.yaml")
    gemm, sdpa, triad = data["cases"]
    assert gemm["median_s"] == pytest.approx(2 * 8192**3 / 250e12)
    # FlashAttention's count: 4 b h s^2 d forward, halved when causal, backward 2.5x
    assert sdpa["median_s"] == pytest.approx(2.5 * 4 * 8 * 16 * 2048**2 * 128 / 2 / 100e12)
    assert triad["op"] == "add" and triad["median_s"] == pytest.approx(3 * 2**28 / 1500e9)
    assert all(c["timed"] == "kernel" and c["source"] == "paper" for c in data["cases"])
    assert [s.row["backend"] for s in skipped] == ["flash3"]  # no such kernel in gpusim
    results_path = data["provenance"]["transcribed_from"]
    assert results_path == "t.yaml" and data["provenance"]["published"]


def test_a_row_must_cite_a_listed_source() -> None:
    bad = _transcription({"kind": "gemm", "precision": "bf16", "m": 1, "n": 1, "k": 1,
                          "tflops": 1})
    bad["rows"][0]["source"] = "elsewhere"
    with pytest.raises(InvalidMeasurement, match="elsewhere"):
        published.convert(bad, "t.yaml")


def test_kernel_timed_cases_are_predicted_without_the_host() -> None:
    gpu = load_gpu("a100-80gb")
    cal = stated_defaults(gpu)
    case = {"id": "g", "kind": "gemm", "precision": "bf16", "m": 64, "n": 64, "k": 64}
    assert predict({**case, "timed": "kernel"}, gpu, cal) < predict(case, gpu, cal)


def _fit(tmp_path: Path, *rows: dict, **extra: str) -> fit.FitResult:
    data, _ = published.convert({**_transcription(*rows), **extra}, "t.yaml")
    path = tmp_path / "measurements" / "published" / "a100-80gb" / "micro.json"
    results.write(path, data)
    return fit.fit(path)


def test_a_fit_moves_only_what_its_cases_show(tmp_path: Path) -> None:
    """Large GEMMs timed on the device say nothing of the ramp or of cuBLAS's host cost;
    forward-only attention says nothing of the backward: those keep their defaults."""
    shapes = [(8192, 8192, 8192, 270), (4096, 4096, 4096, 240), (16384, 8192, 1280, 250)]
    result = _fit(tmp_path, *(
        {"kind": "gemm", "precision": "bf16", "m": m, "n": n, "k": k, "tflops": t}
        for m, n, k, t in shapes), *(
        {"kind": "sdpa", "backend": "flash", "precision": "bf16", "batch": 16384 // s,
         "heads": 16, "seq": s, "head_dim": 128, "causal": False, "pass": "forward",
         "tflops": t} for s, t in ((1024, 150), (4096, 180))),
        sdpa_auto_backend="flash")
    default = stated_defaults(load_gpu("a100-80gb"))
    cal = result.calibration
    assert cal.gemm.ramp_us == default.gemm.ramp_us
    assert cal.overhead.cublas_us == default.overhead.cublas_us
    assert cal.gemm.max_efficiency["bf16"] == pytest.approx(0.8, abs=0.06)
    flash = cal.gemm.attention_kernels["flash2"]
    assert "backward" not in flash  # the backward runs as the default kernel's
    assert flash["forward"] != default.attention_efficiency("flash2", backward=False)
    # SDPA's own choice on this GPU is the flash backend, as the file states
    assert cal.gemm.attention_factor == flash["forward"]
    assert "flash backend" in cal.rationale


@pytest.mark.parametrize("path", TRANSCRIBED, ids=lambda p: p.parent.name)
def test_committed_micro_file_is_its_transcription_converted(path: Path) -> None:
    """measurements/published/<device>/micro.json is written from transcribed.yaml by
    gpusim.measure.published, never by hand."""
    data, _ = published.convert_file(path)
    committed = json.loads(path.with_name("micro.json").read_text())
    assert committed == json.loads(json.dumps(data))


@pytest.mark.parametrize("path", TRANSCRIBED, ids=lambda p: p.parent.name)
def test_every_published_row_names_its_source(path: Path) -> None:
    data = read_yaml(path)
    for source in data["sources"]:
        assert source.get("title") and (source.get("url") or source.get("repo")), source
        assert source.get("where"), source
    ids = {s["id"] for s in data["sources"]}
    assert all(row["source"] in ids for row in data["rows"])


def test_published_convolutions_become_cases_pass_by_pass() -> None:
    """DeepBench's V100 layers: fp16 NHWC rows become conv cases timed pass by pass (no
    transposes: channels-last); its 'fp32' rows, which ran on tensor cores, do not."""
    from gpusim.calibrate.micro_ops import case_ops

    data, skipped = published.convert_file(
        results.measurements_dir() / "published" / "v100-sxm2-16gb" / "transcribed.yaml")
    convs = [c for c in data["cases"] if c["kind"] == "conv"]
    assert convs and all(c["layout"] == "nhwc" and c["precision"] == "fp16" for c in convs)
    assert {c["pass"] for c in convs} == {"forward", "backward_data", "backward_filter"}
    assert any("tensor cores" in s.why for s in skipped)
    gpu = load_gpu("v100-sxm2-16gb")
    for case in convs[:3]:
        names = [op.name for op in case_ops(case, gpu)]
        assert len(names) == 1 and not names[0].endswith("to_nhwc")


def test_unfused_attention_rows_fit_the_factor_of_its_score_kernels(tmp_path: Path) -> None:
    """The FlashAttention benchmarks' "Pytorch" baseline (attention written out) becomes an
    unfused-attention case, whose fit sets the factor of its score-sized products and
    softmax; a row in milliseconds is taken as printed."""
    rows = [{"kind": "sdpa", "backend": "unfused", "precision": "fp16", "batch": 16384 // s,
             "heads": 32, "seq": s, "head_dim": 64, "causal": False,
             "pass": "forward_backward", "tflops": 40} for s in (1024, 2048, 4096)]
    data, skipped = published.convert(_transcription(*rows, {**rows[0], "tflops": None,
                                                             "ms": 12.5}), "t.yaml")
    assert not skipped and data["cases"][-1]["median_s"] == pytest.approx(12.5e-3)
    result = _fit(tmp_path, *rows)
    factor = result.calibration.memory.kernel_factors["unfused_attention"]
    assert 0.3 < factor < 0.9
    assert "unfused attention 3 cases" in result.calibration.rationale


def test_the_ampere_unfused_attention_factor_slows_its_score_kernels_only() -> None:
    from gpusim.cost.kernels import kernel_cost
    from gpusim.hardware.calibration import calibration_for
    from gpusim.workload.attention import UNFUSED_ATTENTION, Attention
    from gpusim.workload.numerics import Numerics

    gpu = load_gpu("a100-80gb")
    cal = calibration_for(gpu)
    assert cal.memory.kernel_factors[UNFUSED_ATTENTION] < 0.8
    num = Numerics(matmul="fp16", conv="fp16", activation="fp16")
    layer = Attention("a", 16, 64, 2048, fused=False, dropout=True)
    ops = {op.name.rsplit(".", 1)[1]: op for op in layer.forward(4, num)
           + layer.backward_input(4, num)}
    scores = {"qk", "softmax", "av", "dv", "dp", "softmax_bwd", "dq", "dk"}
    assert {n for n, op in ops.items() if op.family == UNFUSED_ATTENTION} == scores
    plain = cal.model_copy(update={"memory": cal.memory.model_copy(
        update={"kernel_factors": {}})})
    for name, op in ops.items():
        slowed = kernel_cost(op, gpu, cal).seconds > kernel_cost(op, gpu, plain).seconds
        assert slowed == (name in scores), name  # dropout's passes keep a copy's rate
    fused = Attention("a", 16, 64, 2048).forward(4, num)
    assert all(op.family != UNFUSED_ATTENTION for op in fused)
