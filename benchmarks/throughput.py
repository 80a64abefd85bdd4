"""Published, measured LLM training throughputs (published/throughput.yaml) against gpusim's
predictions: tokens/s per GPU, per case, and the error over the cases gpusim models as they
ran (torch.compile runs compiled; cases that needed an assumption are listed apart).
Validation, never fitted.

    python benchmarks/throughput.py
"""

from __future__ import annotations

from gpusim.validate.published_throughput import load_cases, predict_case, summary


def main() -> None:
    rows = [predict_case(c) for c in load_cases()]
    print(f"{'case':<66}{'measured':>10}{'predicted':>11}{'error':>9}  notes")
    for r in rows:
        if r.predicted is None:
            print(f"{r.id:<66}{r.measured:>10.0f}{'':>11}{'':>9}  skipped: {r.skipped}")
            continue
        print(f"{r.id:<66}{r.measured:>10.0f}{r.predicted:>11.0f}{r.error:>+9.1%}  "
              f"{'; '.join(r.flags)}")
    s = summary(rows)
    if s["cases"]:
        print(f"\n{s['cases']} cases as they ran: mean absolute error {s['mape']:.1%}, mean "
              f"signed {s['mean_signed']:+.1%}, largest {s['max']:+.1%}")
    flagged = [r.error for r in rows if r.error is not None and r.flags]
    if flagged:
        print(f"{len(flagged)} cases with an assumption (notes): mean signed "
              f"{sum(flagged) / len(flagged):+.1%}")
    pairs = {}
    for r in rows:
        if r.predicted is None:
            continue
        key = r.id.replace("_fp8_tensorwise", "").replace("_float8", "").replace("_fp8", "") \
            .replace("_bf16", "")
        pairs.setdefault(key, {})["fp8" if ("fp8" in r.id or "float8" in r.id) else "bf16"] = r
    print("\nFP8 over BF16, same job (measured vs predicted speedup):")
    for key, pair in sorted(pairs.items()):
        if {"fp8", "bf16"} <= set(pair):
            m = pair["fp8"].measured / pair["bf16"].measured
            p = pair["fp8"].predicted / pair["bf16"].predicted  # type: ignore[operator]
            print(f"  {key:<60} measured {m:.2f}x  predicted {p:.2f}x  ({p / m - 1:+.1%})")


if __name__ == "__main__":
    main()
