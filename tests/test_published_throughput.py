"""Published, measured LLM training throughputs (published/throughput.yaml) against the
predictions: every case is sourced and either predicted or skipped with its reason, and the
error over the cases gpusim models as they ran is held to the budget measured when the
benchmark was added (benchmarks/throughput.py prints every row). Validation only."""

from __future__ import annotations

import pytest

from gpusim.validate.published_throughput import (
    RECOMPUTE,
    job_of,
    load_cases,
    predict_case,
    summary,
)

# Set from what was measured (2026-11-23: 12 cases, mean absolute 36.2%, all too fast; then
# 13 cases, 32.8%, with Ampere fitted on published kernels and the first MoE row; then 27
# cases, 26.4%, with torch.compile runs modelled compiled and power limits; then 18.9% with
# llm-foundry's Triton attention costed; 17.0% with the published compute slowdown beside
# communication; 15.5% on 2026-11-24 with long-K GEMM rates and FSDP2's copy-out; 13.8% with
# the power fit's static power, which puts 500 W at the measured 0.87 of the clock); only ever
# tightened for the same cases. 2026-11-24: those 29 cases at 13.6% (attention fitted across
# sequence lengths), then torchao's float8 tables added 3 H100 rows that run as stated and
# are 18-31% fast: 32 cases at 14.53%, the budget set for them. Later that day: 13.6% with a
# product's exposed result write and fp8's byte counts, then 33 cases at 13.62% with the
# Megatron-MoE-ModelZoo's Qwen3-235B over Megatron-FSDP (+14.6%). Later 8.9% (these 33 cases
# as they ran, mean signed +4.0%), then 7.9% (+3.0%) with FSDP's gradient preparation for each
# unit's reduce-scatter costed (FSDP2's copy-in, FSDP1's concatenation, cast and pre-divide).
# Then 34 cases (Megatron-Bridge's Llama 3 8B under Megatron-FSDP, -10%) at 8.0%, and 38 at
# 9.16% with torchtitan's June 2025 async-TP columns (+6 to +29%: async TP over-credited),
# then 8.4% with async TP's own copies and partial-sum pass costed (+1 to +22%), 8.2% with its
# products run shard by shard (+0 to +20%); 8.43% once DeepEP's dispatch sends a token once
# per destination rank or node (the ModelZoo's Qwen3-235B over Megatron-FSDP +11 -> +18%).
# 10.0% once Megatron-Bridge's Qwen3-30B-A3B over EP 16 runs the HybridEP dispatcher its recipe
# names (once per destination node across the two nodes): -6% -> +67%. Its NCCL all-to-all over
# the NICs had hidden what the MoE layers miss, as the same model's PP 2 rows (+53%) show.
# 9.5% (+4.9%) once rotary embeddings and Qwen3's QK norms are costed as each stack runs them.
EAGER_MAPE_BUDGET = 0.096


def test_every_case_is_sourced_and_predicted_or_skipped_with_a_reason() -> None:
    cases = load_cases()
    assert len(cases) >= 25
    ids = [c["id"] for c in cases]
    assert len(set(ids)) == len(ids)
    rows = [predict_case(c) for c in cases]
    for case, row in zip(cases, rows, strict=True):
        assert case["source"]["url_or_repo_path"] and case["source"]["where"]
        assert (row.predicted is not None) != bool(row.skipped), row
    s = summary(rows)
    assert s["cases"] >= 12
    assert s["mape"] <= EAGER_MAPE_BUDGET, s


def test_no_configuration_that_trained_as_stated_is_refused() -> None:
    """A published run that states its recompute mode trained in the memory it had: gpusim
    must not call it out of memory (issue 14). llm-foundry's MPT-3B at 8192 tokens, no
    recompute, was refused until the fused loss and the attention output kept once."""
    for case in load_cases():
        if str(case["training"].get("activation_checkpointing")) not in RECOMPUTE:
            continue
        row = predict_case(case)
        assert "needs" not in (row.skipped or ""), row


def _bridge_cases() -> list[dict]:
    return [c for c in load_cases() if "Megatron-Bridge" in str(c.get("framework", ""))]


def test_megatron_bridge_rows_reduce_gradients_in_bf16() -> None:
    """Megatron-Bridge's performance configs set ddp.grad_reduce_in_fp32 false for every run
    (each row cites where): its rows keep bf16 gradient buffers."""
    bridge = _bridge_cases()
    assert len(bridge) >= 9
    for case in bridge:
        assert str(case["training"]["grad_reduce"]).startswith("bf16: Megatron-Bridge")
        assert job_of(case)[0]["bf16_grads"], case["id"]


@pytest.mark.xfail(strict=True, reason=(
    "known defect (issue 14): refused at 81.7 GiB against 79.2 since Qwen3's QK norms keep "
    "their inputs (TE's RMSNorm saves its contiguous input); the run trained, so something "
    "else is over-counted for it (its recipe was not read: the table's VP 24 and microbatch "
    "2 differ from the 25.11 config's VP 12)"))
def test_qwen3_30b_bridge_2511_row_fits() -> None:
    """Qwen3-30B-A3B's 25.11 row (PP 2 x VP 24, microbatch 2) trained on H100: it must fit
    (it was refused at 83.2 GiB with fp32 gradient buffers, 70.7 GiB with bf16 ones before
    the QK norms were counted)."""
    row = predict_case(next(c for c in _bridge_cases() if c["id"].startswith(
        "mbridge_qwen3_30b") and c["id"].endswith("_2511")))
    assert row.predicted is not None, row


# 2026-11-24: NeMo 24.07's pre-training table (DGX-H100, FP8), 11 of its 12 rows predicted
# with mean absolute error 5.6% and mean signed +4.9% (GPT3-5B +14%, Nemotron-8B +13%, the
# rest -4 to +6%); Nemotron-340B is refused (90.5 GiB against 79.2: NeMo 24.07's apex
# DistributedFusedAdam, which keeps 16-bit remainders of the master weights, is not modelled).
# The same day 6.9% and +6.3%: Megatron's fused SwiGLU costed as the TorchInductor kernels it
# is (jit_fuser is torch.compile), its Llama rows 2-3 points faster.
# 2026-11-25: all 12 rows, Nemotron-340B at -3.6% once its launcher config's apex
# DistributedFusedAdam keeps gradients (grad_sync_dtype bf16) and its states and parameter
# copy (dtype bf16) in bf16: 59 GiB where fp32 states made it 90.5.
# 2026-11-25: 5.9% and +4.6% once rotary embeddings are costed (Transformer Engine's fused
# kernel, one each way on q and k).
NEMO_2407_MAE, NEMO_2407_SIGNED = 0.06, 0.05


def test_nemo_2407_pretraining_table() -> None:
    """NeMo's own 24.07 performance summary: GPT-3, Llama 2 and 3 and Nemotron at FP8 on
    8 to 512 H100s, under Megatron-Core with its padded vocabulary (GPT3-175B was 11-17% slow
    while its 50,257-token logits ran as an unaligned product)."""
    cases = [c for c in load_cases() if c["id"].startswith("nemo2407_")]
    assert len(cases) == 12
    rows = [predict_case(c) for c in cases]
    errors = [r.error for r in rows if r.error is not None]
    assert len(errors) == 12, [r for r in rows if r.error is None]
    mae = sum(abs(e) for e in errors) / len(errors)
    signed = sum(errors) / len(errors)
    assert mae <= NEMO_2407_MAE and abs(signed) <= NEMO_2407_SIGNED, (mae, signed)


def test_nemo_automodel_rows_run_as_their_configs_say() -> None:
    """NeMo AutoModel holds its model in bf16 (from_config's torch_dtype "auto") with bf16
    logits into the loss: its Qwen3-30B row on 8 H100s fits, and its DeepSeek-V3 row under
    pipeline parallelism runs without fp32 master weights instead of being refused."""
    rows = {c["id"]: predict_case(c) for c in load_cases() if "automodel" in c["id"]}
    assert rows and all(r.predicted is not None for r in rows.values()), rows


def test_tflops_rows_compare_tokens_by_the_source_s_own_flop_count() -> None:
    """A source's TFLOP/s is turned back into tokens/s by its own FLOP count (NeMo's llama2
    formula of 2024, attention at full work), and those are compared; gpusim's count (causal
    attention at half) never meets the source's."""
    cases = {c["id"]: c for c in load_cases()}
    layers, hidden, ffn, vocab = 32, 4096, 11008, 32000
    nemo = [c for c in cases.values() if c["id"].startswith("nemo_llama2_7b")]
    assert len(nemo) == 9
    for case in nemo:
        s = case["training"]["seq_len"]
        per_token = layers * hidden**2 * (24 + 18 * ffn / hidden + 12 * s / hidden
                                          + 6 * vocab / (layers * hidden))
        derived = case["measured"]["tokens_per_s_per_gpu"]
        assert derived == pytest.approx(case["measured"]["value"] * 1e12 / per_token, abs=0.1)
        row = predict_case(case)
        assert row.measured == derived
        assert "TFLOP/s by the source's FLOP count" not in row.flags
        assert "microbatch 1 assumed" in row.flags


def test_long_sequences_run_context_parallel_on_megatron_with_delayed_fp8() -> None:
    from gpusim.validate.published_throughput import job_of

    case = next(c for c in load_cases() if c["id"].startswith("nemo_llama2_7b_dgxh100x128_"))
    kwargs, _, why = job_of(case)
    assert not why
    assert (kwargs["cp"], kwargs["tp"], kwargs["seq_len"]) == (4, 4, 131072)
    assert kwargs["stack"] == "megatron" and kwargs["fp8_recipe"] == "delayed"


def test_the_report_splits_errors_by_architecture_and_stack() -> None:
    from gpusim.validate.published_throughput import by_group

    rows = [predict_case(c) for c in load_cases()]
    predicted = [r for r in rows if r.error is not None]
    for key in ("architecture", "stack", "layout"):
        groups = by_group(rows, key)
        assert sum(g["cases"] for g in groups.values()) == len(predicted)
        assert sum(g["as_ran"] for g in groups.values()) == summary(rows)["cases"]
    assert {"hopper", "cdna3", "ampere"} <= set(by_group(rows, "architecture"))
    layouts = by_group(rows, "layout")
    assert {"MoE, PP > 1", "MoE, no PP", "dense, CP > 1", "dense, no CP"} <= set(layouts)
    assert all(0 <= g["within_15"] <= g["cases"] for g in layouts.values())
    cdna3 = [r.error for r in predicted if r.architecture == "cdna3"]
    assert by_group(rows, "architecture")["cdna3"]["mean_signed"] == pytest.approx(
        sum(cdna3) / len(cdna3))
