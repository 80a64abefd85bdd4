"""llm-foundry's MPT benchmark tables (published/llmfoundry_tables.yaml): every row is read as
printed, its model is the one the row trained (gpusim's parameter count equals the table's
NumParams), every row is predicted (none refused for memory), and the error over the 216 rows
is held to the budget measured when they were added (benchmarks/llmfoundry.py prints them).
Validation only: nothing is fitted to these rows."""

from __future__ import annotations

from gpusim.validate.llmfoundry import load_tables, mpt, predict_all, summary

# 2026-11-24: 216 rows, mean absolute error 10.3%, mean signed +4.9% (H100 rows at 32K-65K
# tokens 21-26% slow, the A100 125M rows 24-35% fast). The same day 9.5% and +3.5% with FSDP's
# gradient preparation for each unit's reduce-scatter costed (FSDP1's concatenation, cast and
# pre-divide) and PURE rows reducing in bf16. Only ever tightened.
MAE_BUDGET = 0.097
SIGNED_BUDGET = 0.05


def test_every_table_row_is_read_and_consistent() -> None:
    rows, models = load_tables()
    tables = {r.table for r in rows}
    assert len(rows) == 216 and len(tables) == 5
    for r in rows:
        assert r.global_batch == r.micro_batch * r.grad_accum * r.gpus, r
        assert r.model in models, r


def test_the_model_of_each_row_has_the_row_s_parameter_count() -> None:
    """The yamls' MPT (learned positions as long as the sequence, biases, tied logits) is
    what ran: NumParams grows with the sequence by the position table, and gpusim counts the
    same to the parameter."""
    rows, models = load_tables()
    for r in rows:
        assert mpt(r.model, r.seq_len, models).parameters == r.num_params, r


def test_every_row_is_predicted_within_the_budget() -> None:
    results = predict_all()
    refused = [r for r in results if r.predicted is None]
    assert not refused, refused[:3]
    s = summary(results)
    assert s["mape"] <= MAE_BUDGET, s
    assert abs(s["mean_signed"]) <= SIGNED_BUDGET, s
