"""Predicted against published, measured per-GPU peak memory (published/peak_memory.yaml),
and beside Megatron-LM's theoretical memory formulas on the Megatron dev cases.

Prints each case gpusim can express (what was measured: allocated, reserved or nvidia-smi;
measured and predicted GiB; the error; whether gpusim says it fits), then the cases it
cannot express yet and why, then the mean and largest error. Validation only, never fitted.
Then, per Megatron dev case under selective recompute with sequence parallelism, Megatron's
weights-and-optimizer and activation figures against gpusim's, and what gpusim adds that
Megatron's formula leaves out.

    python benchmarks/memory.py
"""

from __future__ import annotations

import statistics

from gpusim.validate.megatron import CASES
from gpusim.validate.megatron_memory import compare
from gpusim.validate.published_memory import load_cases


def main() -> None:
    cases = load_cases()
    modelled = [c for c in cases if c.job is not None]
    errors = []
    print(f"{'case':58s} {'kind':10s} {'measured':>9s} {'predicted':>9s} {'error':>7s}  fits")
    for case in modelled:
        predicted = case.predicted_gib()
        error = predicted / case.measured_gib - 1
        errors.append(abs(error))
        print(f"{case.id:58s} {case.kind:10s} {case.measured_gib:8.2f}G {predicted:8.2f}G "
              f"{100 * error:+6.1f}%  {'yes' if case.fits() else 'NO'}")
    print(f"\nnot modelled yet ({len(cases) - len(modelled)} of {len(cases)}):")
    reasons: dict[str, int] = {}
    for case in cases:
        if case.job is None:
            reasons[case.skipped] = reasons.get(case.skipped, 0) + 1
    for why, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  {count:3d}  {why}")
    if errors:
        print(f"\n{len(errors)} cases: mean error {100 * statistics.mean(errors):.1f}%, "
              f"largest {100 * max(errors):.1f}%, within 10%: "
              f"{sum(e <= 0.10 for e in errors)}; refused (predicted not to fit): "
              f"{sum(not c.fits() for c in modelled)}")


def megatron() -> None:
    gib = 2.0**30
    print(f"\n{'Megatron dev case (selective, SP)':36s} {'states M':>9s} {'gpusim':>8s} "
          f"{'acts M':>8s} {'gpusim':>8s} {'+other':>7s}  GiB per GPU")
    for case in CASES:
        r = compare(case)
        print(f"{case.id:36s} {r.megatron_states / gib:9.2f} {r.gpusim_states / gib:8.2f} "
              f"{r.megatron_activations / gib:8.2f} {r.gpusim_activations / gib:8.2f} "
              f"{r.gpusim_other / gib:7.2f}")
    print("states: Megatron counts 18 bytes a parameter; these fp16 runs keep fp16 gradients "
          "(16 bytes), as Megatron-LM does for fp16, and gpusim counts the learned position "
          "table the formula leaves out. +other: transient buffers, library workspaces, the "
          "CUDA context and NCCL's communicators, which the formula leaves out too.")


if __name__ == "__main__":
    main()
    megatron()
