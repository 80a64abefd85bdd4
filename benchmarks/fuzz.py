"""Fuzz the command line: N random command lines (default 2,000), each classified as a sane
result, a clean domain error, or a defect (traceback, nonsense, badly formed error, or a run
over the time limit), with counts per class and the first examples of each defect.
``--explore`` draws sweep, search, compare and scaling command lines instead of estimate and
memory ones.

    python benchmarks/fuzz.py [N] [--seed S] [--explore]
"""

from __future__ import annotations

import argparse
import collections
import random
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.fuzz_cli import Outcome, random_command_line, random_explore_command_line, run

LIMIT_S = 60


def _alarm(signum: int, frame: object) -> None:
    raise TimeoutError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("n", type=int, nargs="?", default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--explore", action="store_true",
                        help="sweep, search, compare and scaling command lines")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    counts: collections.Counter[str] = collections.Counter()
    examples: dict[str, list[tuple[list[str], str]]] = collections.defaultdict(list)
    slowest: tuple[float, list[str]] = (0.0, [])
    signal.signal(signal.SIGALRM, _alarm)
    began = time.perf_counter()
    for _ in range(args.n):
        argv = (random_explore_command_line if args.explore else random_command_line)(rng)
        start = time.perf_counter()
        signal.alarm(LIMIT_S)
        try:
            outcome = run(argv)
        except TimeoutError:
            outcome = Outcome("hang", f"over {LIMIT_S} s")
        finally:
            signal.alarm(0)
        slowest = max(slowest, (time.perf_counter() - start, argv))
        counts[outcome.kind] += 1
        if outcome.kind not in ("result", "error") and len(examples[outcome.kind]) < 5:
            examples[outcome.kind].append((argv, outcome.detail))
    print(f"{args.n} command lines in {time.perf_counter() - began:.0f} s")
    for kind in ("result", "error", "traceback", "nonsense", "bad error", "hang"):
        print(f"  {kind:<10} {counts[kind]:6d}")
    print(f"  slowest    {slowest[0]:.1f} s: gpusim {' '.join(slowest[1])}")
    for kind, rows in examples.items():
        print(f"\n{kind}:")
        for argv, detail in rows:
            print(f"  gpusim {' '.join(argv)}\n    {detail}")


if __name__ == "__main__":
    main()
