"""torchtitan as its published runs ran it: how it pipelines a local batch when a run leaves
it unstated (the defaults of its pipeline code, at the commit its benchmarks ran), and which
commits belong to its mid-2025 stack."""

from __future__ import annotations

from typing import Any

# The torchtitan commits of mid 2025 that published runs name (its June 2025 async-TP and
# H200 pages; torchao's August 2025 B200 and MI300X runs): stacks/torchtitan-2025.yaml.
MID_2025_COMMITS = ("820504e", "e7c0cae", "6fc499f6", "2c8b5947")

def torchtitan_pipeline(t: dict[str, Any], pp: int, local: int, layers: int
                         ) -> tuple[int, int, str, int, tuple[int, ...]]:
    """(local batch, microbatch, schedule, stages per rank, blocks per stage) as torchtitan
    @9dec370 pipelines a local batch: torchtitan/parallelisms/pipelining_utils.py splits it
    into pipeline_parallel_microbatches (by default the pipeline degree), gives a
    multi-stage schedule (Interleaved 1F1B) two stages per rank, and, with no split points,
    generate_split_points deals the layers: the first stage the base count, the middle ones
    one more while the remainder lasts, the last what is left."""
    stated = t.get("pp_microbatches")
    count = stated if isinstance(stated, int) else pp
    interleaved = "interleaved" in str(t.get("pp_schedule", "")).lower()
    stages = pp * (2 if interleaved else 1)
    base, extra = divmod(layers, stages)
    split = [base]
    for _ in range(stages - 2):
        split.append(base + 1 if extra > 0 else base)
        extra -= 1 if extra > 0 else 0
    split.append(layers - sum(split))
    return (local, local // count, "interleaved" if interleaved else "1f1b",
            2 if interleaved else 1, tuple(split))
