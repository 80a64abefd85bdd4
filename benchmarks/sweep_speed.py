"""How fast a what-if sweep runs: 1000 single-GPU points of ResNet-50 on a modified H100
(10 memory bandwidths x 10 bf16 tensor-core peaks x 10 batch sizes), written to a CSV file
point by point as ``gpusim sweep --out`` does, on a local process pool.

Target: under 10 s on a 2-core machine (issue 21). Prints the wall time; it asserts nothing
(machines are shared and noisy).

    python benchmarks/sweep_speed.py [--workers N]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from gpusim.explore.sweep import sweep

TARGET_S = 10.0  # issue 21: 1,000 points on 2 cores
BASE = {"model": "resnet50", "gpu": "h100-sxm", "precision": "bf16"}
VARY = {
    "gpu.memory_bandwidth_gb_s": [1000 + 400 * i for i in range(10)],
    "gpu.matrix_tflops.bf16": [400 + 100 * i for i in range(10)],
    "batch_size": [32 * (i + 1) for i in range(10)],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        result = sweep(BASE, VARY, out=Path(folder) / "sweep.csv", workers=args.workers)
        seconds = time.perf_counter() - start
    points = len(result.rows)
    verdict = "ok" if seconds <= TARGET_S else "MISSED"
    print(f"{points} points (resnet50, h100-sxm, bf16; {result.infeasible} do not run) on "
          f"{args.workers} worker processes ({os.cpu_count()} CPUs)")
    print(f"  {seconds:.1f} s in all, {1e3 * seconds / points:.1f} ms per point, "
          f"target {TARGET_S:.0f} s: {verdict}")


if __name__ == "__main__":
    main()
