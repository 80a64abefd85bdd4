"""Megatron-LM semantics (fused optimizer, fp32 vocab-parallel loss) and the published
multi-GPU figures: Megatron-LM's tables and DeepLearningExamples' data-parallel scaling."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from gpusim.hardware.catalog import load_gpu
from gpusim.plan.job import TrainingJob
from gpusim.plan.lower import microbatch_ops
from gpusim.plan.optimizer_step import optimizer_ops
from gpusim.validate.megatron import CASES, job_for, predict
from gpusim.workload import zoo

ROOT = Path(__file__).resolve().parents[1]


def _benchmark(monkeypatch: pytest.MonkeyPatch, name: str) -> ModuleType:
    """A script of benchmarks/ as a module (they import their siblings by name)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module(name)


# Accuracy as of this commit (benchmarks/megatron.py prints it): max 16.5%, mean 8.7%. The
# issue's target is 10% on every case. The V100 rows (DGX-2) land within 7%; the same
# workloads on A100s run 5-10% (40 GB; one row 3.5% slow) and 6-17% (80 GB) fast: the Ampere
# default kernel efficiencies, not the parallel model (the largest miss, SC'21 1.7B, has no
# TP or PP and hides its data-parallel reduction). Megatron-LM's fused optimizer and running
# the head and loss once under full checkpointing each moved every row faster; its fp32
# vocab-parallel cross-entropy moved them back by under 1%. Attention's layout copies
# (merging heads, packing dq/dk/dv: kernels of their own in profiled H100 steps) moved every
# row slower: each A100 row closer, the two smallest V100 rows from 5.6% and 4.9% to 6.7%
# and 5.7% slow, the mean from 9.1% to 8.7%. Fitting Ampere and Volta on published kernel
# figures (measurements/published/) instead of stated defaults: max 15.1%, mean 7.4%, 16 of
# 22 within 10% (was 14); the V100 rows move 1-8% faster (DeepBench's V100 GEMMs put fp16 at
# 0.86 of peak, not the stated 0.8), the slowest to 7.3%. 2026-11-24: unfused attention's
# score-sized products and softmax stream at 0.56 of a copy's rate on Ampere (fitted on the
# FlashAttention-2 README's A100 80GB timings of PyTorch's unfused attention), Volta's stated
# at 0.65: max 11.9% (the 1024-GPU 2020 row, now slow), mean 3.9%, 21 of 22 within 10%.
MEGATRON_MAX_ERROR = 0.12
MEGATRON_MEAN_ERROR = 0.045
MEGATRON_V100_MAX_ERROR = 0.08


@pytest.mark.parametrize("precision, per_param", [
    # fp16 grads copied up (2+4) and unscaled (8); norm (4); fused Adam (16+12); copy back (4+2)
    ("fp16", 6 + 8 + 4 + 28 + 6),
    ("bf16", 4 + 28 + 6),  # bf16 gradients accumulate in fp32: no copy, no loss scale
])
def test_megatron_optimizer_is_one_fused_update_around_master_weights(precision: str,
                                                                       per_param: int) -> None:
    model = zoo.get("gpt2")
    job = TrainingJob(model, load_gpu("a100-80gb"), 8, precision,  # type: ignore[arg-type]
                      master_weights=True)
    ops = optimizer_ops(job)
    assert sum(op.bytes for op in ops) == pytest.approx(per_param * model.parameters, rel=1e-6)
    assert len({op.name.rsplit(".", 1)[0] for op in ops}) == (5 if precision == "fp16" else 3)


def test_megatron_computes_the_loss_in_fp32_pass_by_pass() -> None:
    """Cast up (2+4), max (4), subtract (8), exp (8), sum (4), divide (8) | scale (8), cast
    back (4+2): 52 bytes a logit, against 36 for PyTorch's fused log-softmax path."""
    model = zoo.get("gpt2")
    loss = model.layers[-1]
    logits = 4 * model.tokens_per_sample * loss.classes  # type: ignore[attr-defined]

    def moved(master: bool) -> float:
        job = TrainingJob(model, load_gpu("a100-80gb"), 4, "fp16", master_weights=master)
        return sum(op.bytes for op in microbatch_ops(job) if op.layer == "loss")

    assert moved(True) == pytest.approx(52 * logits, rel=1e-3)
    assert moved(False) == pytest.approx(36 * logits, rel=1e-3)


def test_2020_dgx_a100_rows_run_on_the_40gb_launch_model() -> None:
    # The 80 GB A100 was announced after the 2020 tables were published.
    rows = [c for c in CASES if c.id.startswith("megatron_2020") and "dgxa100" in c.id]
    assert rows and all(c.system == "dgx-a100-320gb" for c in rows)
    assert job_for(rows[0]).topology.system.gpu == "a100-40gb"


def test_megatron_cases_within_budget() -> None:
    errors = {case.id: abs(predict(case).error) for case in CASES}
    assert max(errors.values()) <= MEGATRON_MAX_ERROR
    assert sum(errors.values()) / len(errors) <= MEGATRON_MEAN_ERROR
    v100 = [errors[case.id] for case in CASES if case.system == "dgx-2"]
    assert len(v100) == 4 and max(v100) <= MEGATRON_V100_MAX_ERROR


def test_megatron_cases_match_the_shared_reference() -> None:
    path = Path(__file__).resolve().parents[1] / "published" / "dev_cases.yaml"
    rows = {r["id"]: r for r in yaml.safe_load(path.read_text())["A_large_scale"]}
    for case in CASES:
        row = rows[case.id]
        par, model = row["parallelism"], row["model"]
        assert (case.num_gpus, case.tp, case.pp, case.dp) == (row["num_gpus"], par["tp"],
                                                               par["pp"], par["dp"])
        assert (case.layers, case.hidden, case.heads, case.seq_len) == (
            model["layers"], model["hidden"], model["heads"], model["seq_len"])
        assert case.global_batch == par["global_batch"]
        assert case.measured == row["value"]


# As of this commit (python benchmarks/data_parallel_scaling.py): 31 scaling efficiencies of
# DeepLearningExamples' ResNet-50, BERT-large and Transformer-XL runs, predicted within 4.6
# points on average (max 15.7: ResNet-50 AMP on a DGX A100, measured 84%); BERT-large fp16
# seq 128 on 1 to 32 DGX A100 nodes within 1.1 points at every size.
SCALING_MEAN_GAP = 0.05
SCALING_BERT_FP16_GAP = 0.02


def test_data_parallel_scaling_follows_the_published_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    path = ROOT / "published" / "dev_cases.yaml"
    scaling = _benchmark(monkeypatch, "data_parallel_scaling")
    tables = scaling.evaluate(yaml.safe_load(path.read_text())["B_single_node"])
    gaps = [abs(p - m) for t in tables for s in t if s.efficiency for p, m in [s.efficiency]]
    assert len(gaps) >= 31
    assert sum(gaps) / len(gaps) <= SCALING_MEAN_GAP
    bert = next(t for t in tables if t[-1].run.row["id"].endswith("32node_seq128_fp16"))
    assert [s.run.gpus for s in bert] == [8, 16, 32, 64, 128, 256]
    for s in bert[1:]:
        assert s.efficiency is not None
        assert abs(s.efficiency[0] - s.efficiency[1]) <= SCALING_BERT_FP16_GAP


# DeepLearningExamples' single-GPU rows (python benchmarks/dev_cases.py), never fitted:
# MAPE 17.3% over 18 cases on 2026-11-24 (21.0% before unfused attention's factors: Ampere's
# fitted, Volta's stated).
DLE_SINGLE_GPU_MAPE = 0.18


def test_deeplearningexamples_single_gpu_rows_within_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    dev_cases = _benchmark(monkeypatch, "dev_cases")
    rows = yaml.safe_load((ROOT / "published" / "dev_cases.yaml").read_text())["B_single_node"]
    cases = [(row, dev_cases._case(row)[0]) for row in rows if row["num_gpus"] == 1]
    errors = [abs(dev_cases.predicted_value(args, row) / row["value"] - 1)
              for row, args in cases if args is not None]
    assert len(errors) == 18
    assert sum(errors) / len(errors) <= DLE_SINGLE_GPU_MAPE


# FasterTransformer's BERT-base encoder forward passes (python benchmarks/forward_passes.py),
# where the device sets the pace: A100 TF32 and V100 FP32 within 4-10% on 2026-11-24 (the
# 16-bit rows run 26-35% longer than predicted; not explained yet).
FORWARD_TF32_FP32_MEAN_ERROR = 0.10


def test_published_bert_forward_passes_in_32_bit_within_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _benchmark(monkeypatch, "forward_passes")
    rows = [r for r in yaml.safe_load(bench.ROWS.read_text())["forward_passes"]
            if bench.gpu_of(r) in ("a100-80gb", "v100-sxm2-16gb") and r["dtype"] != "fp16"
            and r["shape"]["batch"] * r["shape"]["seq"] >= bench.MIN_TOKENS]
    errors = [abs(bench.predicted_ms(r) / r["value"] - 1) for r in rows]
    assert len(errors) == 6
    assert sum(errors) / len(errors) <= FORWARD_TF32_FP32_MEAN_ERROR
