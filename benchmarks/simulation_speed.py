"""How fast the simulator runs: one ResNet-50 step, and one GPT-3 175B step at layer
granularity on an imaginary single GPU with memory enough to hold it.

Targets (issue 2): ResNet-50 under 50 ms, GPT-3 175B under 0.5 s, on a 2-core machine.
Prints the median of several runs; it asserts nothing (machines are shared and noisy).

    python benchmarks/simulation_speed.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from gpusim.estimate import simulate_step
from gpusim.hardware.catalog import load_gpu
from gpusim.plan.job import TrainingJob
from gpusim.workload import zoo


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    h100 = load_gpu("h100-sxm")
    huge = h100.model_copy(update={"name": "imaginary-huge", "memory_gib": 1e5})
    resnet = zoo.get("resnet50")
    gpt3 = zoo.get("gpt3-175b")
    cases = [
        ("resnet50, batch 256, bf16, H100", 0.050,
         lambda: simulate_step(TrainingJob(resnet, h100, 256, "bf16")), 10),
        ("gpt3-175b, batch 1, bf16, one huge GPU", 0.5,
         lambda: simulate_step(TrainingJob(gpt3, huge, 1, "bf16")), 3),
    ]
    print(f"{'case':42s} {'median':>10s} {'target':>10s}  verdict")
    for label, target, run, repeats in cases:
        run()  # warm caches (zoo construction, calibration files)
        seconds = median_seconds(run, repeats)
        verdict = "ok" if seconds <= target else "MISSED"
        print(f"{label:42s} {seconds * 1e3:8.1f} ms {target * 1e3:8.0f} ms  {verdict}")


if __name__ == "__main__":
    main()
