"""How fast the simulator runs: one ResNet-50 estimate on an A100 through ``estimate()``, one
ResNet-50 step, one GPT-3 175B step at layer granularity on an imaginary single GPU with
memory enough to hold it, and one GPT-3 175B step on 1024 A100s (TP 8, PP 16, DP 8, 1F1B,
microbatch 1, batch 1536, selective recompute), with one unit per stage and per rank.

Targets on a 2-core machine: the ResNet-50 estimate (batch 256, bf16, one A100: planning and
simulation, in-process) under 10 ms (issue 21); ResNet-50 under 50 ms, GPT-3 175B on one GPU
under 0.5 s (issue 2); the 1024-GPU step under 0.15 s in-process through ``estimate()`` and
under 1 s per rank (issue 21). Per-rank work grows linearly with the ranks: simulating every
rank of 4096 GPUs (DP 32, batch 6144: four times the replicas, the same microbatches each)
should take about four times as long as of 1024; the target printed is four times the
1024-GPU simulation measured just before. Those two are planned once and simulated directly,
so they time the simulation alone (``benchmarks/parallel_speed.py`` prints the scaling up to
32,768 GPUs). Prints the median of several runs; it asserts nothing (machines are shared
and noisy).

    python benchmarks/simulation_speed.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from gpusim.estimation import build_job, estimate, simulate_step
from gpusim.hardware.catalog import load_gpu
from gpusim.plan.job import TrainingJob
from gpusim.plan.parallel import plan_parallel
from gpusim.sim.pipeline import simulate_pipeline
from gpusim.workload import zoo

GPT3_1024: dict[str, Any] = {
    "model": "gpt3-175b", "gpu": None, "batch_size": 1536, "precision": "bf16",
    "system": "dgx-a100", "num_gpus": 1024, "tp": 8, "pp": 16, "dp": 8,
    "microbatch_size": 1, "schedule": "1f1b", "checkpointing": "selective"}
GPT3_4096 = {**GPT3_1024, "num_gpus": 4096, "dp": 32, "batch_size": 6144}
Case = tuple[str, float, Callable[[], object], int]  # label, target seconds, run, repeats


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def per_rank_step(options: dict[str, Any]) -> Callable[[], object]:
    """Plan once, then simulate every replica of every stage (as ``estimate`` would)."""
    job, _ = build_job(**options)
    plan = plan_parallel(job)  # type: ignore[arg-type]
    return lambda: simulate_pipeline(plan, per_rank=True)


def main() -> None:
    h100 = load_gpu("h100-sxm")
    huge = h100.model_copy(update={"name": "imaginary-huge", "memory_gib": 1e5})
    resnet = zoo.get("resnet50")
    gpt3 = zoo.get("gpt3-175b")
    cases: list[Case] = [
        ("resnet50, batch 256, bf16, A100, estimate()", 0.010,
         lambda: estimate("resnet50", "a100-80gb", 256, precision="bf16"), 10),
        ("resnet50, batch 256, bf16, H100", 0.050,
         lambda: simulate_step(TrainingJob(resnet, h100, 256, "bf16")), 10),
        ("gpt3-175b, batch 1, bf16, one huge GPU", 0.5,
         lambda: simulate_step(TrainingJob(gpt3, huge, 1, "bf16")), 3),
        ("gpt3-175b, 1024 A100s, estimate()", 0.15, lambda: estimate(**GPT3_1024), 7),
        ("gpt3-175b, 1024 A100s, estimate() per rank", 1.0,
         lambda: estimate(**GPT3_1024, per_rank=True), 3),
    ]
    print(f"{'case':44s} {'median':>10s} {'target':>10s}  verdict")
    for case in cases:
        report(*case)
    per_rank_1024 = report("gpt3-175b, 1024 A100s, simulated per rank", None,
                           per_rank_step(GPT3_1024), 3)
    report("gpt3-175b, 4096 A100s, simulated per rank", 4 * per_rank_1024,
           per_rank_step(GPT3_4096), 3)


def report(label: str, target: float | None, run: Callable[[], object], repeats: int) -> float:
    run()  # warm caches (zoo construction, calibration files)
    seconds = median_seconds(run, repeats)
    if target is None:
        print(f"{label:44s} {seconds * 1e3:8.1f} ms")
    else:
        verdict = "ok" if seconds <= target else "MISSED"
        print(f"{label:44s} {seconds * 1e3:8.1f} ms {target * 1e3:8.0f} ms  {verdict}")
    return seconds


if __name__ == "__main__":
    main()
