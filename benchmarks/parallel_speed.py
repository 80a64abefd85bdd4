"""How long the simulator takes at scale: one step of GPT-3 175B on 1024 A100s (TP 8, PP 16,
DP 8, 1F1B; target under 2 s on a 2-core machine), and a search over every valid
configuration for the same model and GPUs (target under 60 s, and 450 configurations a
second: issue 21).

    python benchmarks/parallel_speed.py
"""

from __future__ import annotations

import time

from gpusim.comm.topology import Topology
from gpusim.estimate import estimate
from gpusim.explore.search import search
from gpusim.workload import zoo


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


if __name__ == "__main__":
    main()
