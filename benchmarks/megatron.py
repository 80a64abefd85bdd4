"""Predicted against the published Megatron-LM figures (SC'21 Table 1; the 2020 tables).

Prints, per case, the split, the predicted and measured figure (TFLOP/s per GPU, or
iteration time in ms), the relative error, where the predicted step went, and how long the
simulation took; then the mean absolute error. Nothing here is fitted to these figures: the
GPUs run on their architecture's stated default efficiencies (gpusim profiles show).

    python benchmarks/megatron.py
"""

from __future__ import annotations

import statistics
import time

from gpusim.validate.megatron import CASES, predict

SHORT = {"forward": "fwd", "backward": "bwd", "recompute": "rec", "tensor_parallel_comm": "tp",
         "pipeline_bubble": "bubble", "pipeline_comm": "p2p", "data_parallel_comm": "dp",
         "optimizer": "opt", "comm_slowdown": "slow", "context_parallel_comm": "cp",
         "expert_parallel_comm": "ep", "host_dispatch": "host", "input_pipeline": "input"}


def main() -> None:
    print(f"{'case':36s} {'GPUs':>5s} {'TPxPPxDP':>10s} {'pred':>8s} {'meas':>8s} "
          f"{'error':>7s}  {'sim s':>5s}  step breakdown (%)")
    errors = []
    for case in CASES:
        start = time.perf_counter()
        pred = predict(case)
        elapsed = time.perf_counter() - start
        errors.append(abs(pred.error))
        step = pred.step
        parts = " ".join(f"{SHORT.get(k, k)} {100 * v / step.step_time_s:.0f}"
                         for k, v in step.breakdown_s.items() if v >= 0.005 * step.step_time_s)
        unit = "TF/s" if case.metric == "tflops_per_gpu" else "ms"
        split = f"{case.tp}x{case.pp}x{case.dp}"
        print(f"{case.id:36s} {case.num_gpus:5d} {split:>10s} {pred.predicted:8.1f} "
              f"{case.measured:8.1f} {100 * pred.error:+6.1f}%  {elapsed:5.2f}  {parts}  "
              f"[{unit}]")
    print(f"\n{len(errors)} cases: mean absolute error {100 * statistics.mean(errors):.1f}%, "
          f"max {100 * max(errors):.1f}%, within 10%: "
          f"{sum(e <= 0.10 for e in errors)} of {len(errors)}")


if __name__ == "__main__":
    main()
