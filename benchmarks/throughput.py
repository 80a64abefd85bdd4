"""Published, measured LLM training throughputs (published/throughput.yaml) against gpusim's
predictions: tokens/s per GPU, per case, and the error over the cases gpusim models as they
ran (torch.compile runs compiled; cases that needed an assumption are listed apart).
Validation, never fitted.

    python benchmarks/throughput.py
"""

from __future__ import annotations

from gpusim.validate.published_throughput import by_group, load_cases, predict_case, summary


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


    for key, label in (("architecture", "GPU architecture"), ("stack", "stack"),
                       ("layout", "layout")):
        print(f"\nBy {label} (every predicted case; 'as ran': those without an assumption):")
        print(f"  {label:<22}{'cases':>6}{'mean signed':>13}{'MAE':>8}{'<=15%':>7}"
              f"{'as ran':>8}{'signed':>9}")
        for name, g in by_group(rows, key).items():
            ran = f"{g['as_ran_signed']:>+9.1%}" if g["as_ran"] else f"{'':>9}"
            print(f"  {name:<22}{g['cases']:>6}{g['mean_signed']:>+13.1%}{g['mape']:>8.1%}"
                  f"{g['within_15']:>7}{g['as_ran']:>8}{ran}")


if __name__ == "__main__":
    main()
