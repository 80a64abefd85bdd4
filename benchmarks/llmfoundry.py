"""Predicted against llm-foundry's MPT benchmark tables (published/llmfoundry_tables.yaml).

Every row of MosaicML's five tables (H100 BF16 at scale and on 8-64 GPUs, H100 FP8, A100
80GB, A100 40GB): predicted and measured tokens/s per GPU, the error, then the mean absolute
and signed error by table, by sequence length and by model size. Validation only: these rows
are never fitted.

    python benchmarks/llmfoundry.py [--rows]
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable

from gpusim.tables import add_row, new_table, render
from gpusim.validate.llmfoundry import Predicted, predict_all, summary


def _print(columns: list[str], rows: list[list[object]]) -> None:
    table = new_table(columns, left=columns[:1])
    for row in rows:
        add_row(table, row)
    print(render(table))


def _group(results: list[Predicted], key: Callable[[Predicted], object], title: str) -> None:
    groups: dict[object, list[Predicted]] = {}
    for r in results:
        groups.setdefault(key(r), []).append(r)
    if all(isinstance(k, int) for k in groups):  # sequence lengths in order
        groups = dict(sorted(groups.items(), key=lambda kv: str(kv[0]).zfill(12)))
    rows = []
    for name, members in groups.items():
        s = summary(members)
        if not s["cases"]:
            continue
        errors = [m.error for m in members if m.error is not None]
        rows.append([str(name), s["cases"], f"{100 * s['mean_signed']:+.1f}%",
                     f"{100 * s['mape']:.1f}%", f"{100 * statistics.median(errors):+.1f}%",
                     f"{s['within_10']}/{s['cases']}"])
    _print([title, "rows", "mean signed", "MAE", "median", "within 10%"], rows)
    print()


def main(show_rows: bool = False) -> None:
    results = predict_all()
    if show_rows:
        _print(
            ["table", "row", "measured", "predicted", "error", "note"],
            [[r.row.table.split(" with ")[0], r.row.id, r.row.tokens_per_s_per_gpu,
              f"{r.predicted:.0f}" if r.predicted else "-",
              f"{100 * r.error:+.1f}%" if r.error is not None else "-",
              r.skipped or "; ".join(r.flags)] for r in results])
        print()
    _group(results, lambda r: r.row.table.split(" with ")[0], "table (tokens/s per GPU)")
    _group(results, lambda r: r.row.seq_len, "sequence length")
    _group(results, lambda r: r.row.model, "model")
    _group(results, lambda r: "checkpointed" if r.row.activation_checkpointing else "no recompute",
           "activation checkpointing")
    s = summary(results)
    skipped = sum(r.predicted is None for r in results)
    print(f"{s['cases']} rows predicted ({skipped} not): mean absolute error "
          f"{100 * s['mape']:.1f}%, mean signed {100 * s['mean_signed']:+.1f}%, within 10%: "
          f"{s['within_10']}, within 15%: {s['within_15']}")


if __name__ == "__main__":
    main(show_rows="--rows" in sys.argv[1:])
