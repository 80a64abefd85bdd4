"""How long the simulator takes at scale: one step of GPT-3 175B on 1024 A100s (TP 8, PP 16,
DP 8, 1F1B; target under 2 s on a 2-core machine), a search over every valid configuration
for the same model and GPUs (target under 60 s, and 450 configurations a second: issue 21),
and how the per-rank simulation scales: the same job on 1024, 4096 and 8192 GPUs (and
32,768 with --32k; target 30 s and under 2 GB), every replica of every stage simulated,
with the trace as ``estimate(per_rank=True)`` records it. Each size keeps 192 microbatches
per replica (batch 192 x DP), so the passes grow with the GPUs; linear scaling shows as the
same seconds per 1,000 passes at every size. Medians of three runs (one at 32,768); peak
memory is the process's maximum resident size so far (sizes run smallest first).

    python benchmarks/parallel_speed.py [--32k]
"""

from __future__ import annotations

import resource
import statistics
import sys
import time

from gpusim.comm.topology import Topology
from gpusim.estimation import build_job, estimate
from gpusim.explore.search import search
from gpusim.plan.parallel import plan_parallel
from gpusim.sim.pipeline import simulate_pipeline
from gpusim.workload import zoo


def per_rank_scaling(sizes: list[int]) -> None:
    """Milliseconds per 1,000 passes of the per-rank simulation at each size."""
    print(f"{'per rank, GPUs':>16s} {'passes':>10s} {'median s':>9s} {'ms/1k passes':>13s} "
          f"{'vs first':>9s} {'peak RSS':>9s}")
    first = 0.0
    for gpus in sizes:
        dp = gpus // 128
        job, _ = build_job("gpt3-175b", None, 192 * dp, precision="bf16", system="dgx-a100",
                           num_gpus=gpus, tp=8, pp=16, dp=dp, microbatch_size=1,
                           schedule="1f1b", checkpointing="selective")
        plan = plan_parallel(job)  # type: ignore[arg-type]
        times = []
        for _ in range(3 if gpus <= 8192 else 1):
            start = time.perf_counter()
            result = simulate_pipeline(plan, per_rank=True)
            times.append(time.perf_counter() - start)
            del result
        seconds = statistics.median(times)
        per_1k = 1e6 * seconds / (2 * dp * 16 * plan.microbatches)
        first = first or per_1k
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{gpus:16,d} {2 * dp * 16 * plan.microbatches:10,d} {seconds:9.2f} "
              f"{per_1k:13.2f} {per_1k / first:8.2f}x {peak_mb:7.0f} MB")


def main() -> None:
    start = time.perf_counter()
    result = estimate("gpt3-175b", None, 1536, system="dgx-a100", num_gpus=1024, tp=8, pp=16,
                      dp=8, microbatch_size=1, schedule="1f1b", checkpointing="selective",
                      precision="bf16", tokens=3e11)
    step_s = time.perf_counter() - start
    print(f"GPT-3 175B, 1024 GPUs, TP 8 x PP 16 x DP 8, 1F1B: one step simulated in "
          f"{step_s:.2f} s (target < 2 s); predicted step {result.step.step_time_s:.2f} s, "
          f"MFU {100 * result.step.mfu:.1f}%")
    start = time.perf_counter()
    found = search(zoo.get("gpt3-175b"), Topology.build("dgx-a100", 1024), 1536)
    search_s = time.perf_counter() - start
    best = found.ranked[0]
    print(f"search: {found.considered} configurations ({len(found.ranked)} fit) in "
          f"{search_s:.1f} s (target < 60 s), {found.considered / search_s:.0f} per second "
          f"(target 450); "
          f"best {best.config.describe()}, recompute {best.checkpointing}: "
          f"{best.step_time_s:.2f} s per step")
    per_rank_scaling([1024, 4096, 8192] + ([32768] if "--32k" in sys.argv[1:] else []))


if __name__ == "__main__":
    main()
