"""Pipeline schedules: the order in which each stage runs its forward and backward passes,
and the activations that order keeps alive."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    """One pass on one stage: forward or backward of model chunk ``chunk`` (its index within
    the stage) for microbatch ``micro``."""

    kind: str  # "F" or "B"
    micro: int
    chunk: int


def schedule(name: str, stage: int, stages: int, micro: int, chunks: int) -> list[Task]:
    """The order in which ``stage`` runs its passes.

    GPipe: every forward, then every backward. 1F1B (PipeDream-Flush): ``stages - stage - 1``
    warm-up forwards, then one forward and one backward in turn, then the remaining backwards.
    Interleaved 1F1B (Megatron-LM): the same over ``chunks`` model chunks per stage, the k-th
    forward running chunk ``(k // stages) % chunks``, with the longer warm-up Megatron-LM uses.
    """
    if name == "gpipe":
        forwards = [Task("F", m, c) for m in range(micro) for c in range(chunks)]
        backwards = [Task("B", m, c) for m in range(micro) for c in reversed(range(chunks))]
        return forwards + backwards
    total = micro * chunks

    def task(kind: str, k: int) -> Task:
        group, within = divmod(k, stages * chunks)
        chunk = within // stages
        if kind == "B":
            chunk = chunks - 1 - chunk
        return Task(kind, group * stages + within % stages, chunk)

    if chunks == 1:
        warmup = min(stages - stage - 1, micro)
    else:
        warmup = min((stages - stage - 1) * 2 + (chunks - 1) * stages, total)
    order = [task("F", k) for k in range(warmup)]
    for i in range(total - warmup):
        order += [task("F", warmup + i), task("B", i)]
    order += [task("B", k) for k in range(total - warmup, total)]
    return order


def peak_in_flight(tasks: list[Task], chunk_bytes: list[float]) -> float:
    """The most activation bytes a stage holds at once: a forward pass keeps its chunk's
    activations until the matching backward pass frees them."""
    held = peak = 0.0
    for t in tasks:
        held += chunk_bytes[t.chunk] if t.kind == "F" else -chunk_bytes[t.chunk]
        peak = max(peak, held)
    return peak
