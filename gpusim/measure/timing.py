"""Timing a region of PyTorch work: warm-up, repeats, medians, on CUDA or the CPU.

On CUDA, events are recorded around the region and read after a synchronize; on the CPU,
``perf_counter`` brackets it (CPU ops run synchronously). A region can hold ``inner`` calls,
so kernels far shorter than the timer's resolution are timed as a loop and divided.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

WARMUP_ITERS = 10
WARMUP_S = 1.0
REPEATS = 30
MIN_REPEATS = 10
REGION_S = 1e-3  # shortest region worth timing; shorter work is looped ``inner`` times
LONG_REPEAT_S = 0.5  # past this per repeat, use MIN_REPEATS (the CPU's large cases)


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median, 10th and 90th percentiles over ``repeats`` samples."""

    median_s: float
    p10_s: float
    p90_s: float
    repeats: int
    inner: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, samples: list[float], inner: int = 1) -> Timing:
        """The median and 10th/90th percentiles of ``samples`` (seconds per call)."""
        return cls(statistics.median(samples), _quantile(samples, 0.1),
                   _quantile(samples, 0.9), len(samples), inner)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Clock:
    """Brackets a region with CUDA events or perf_counter."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device

    def start(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def elapsed(self, start: Any) -> float:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / 1e3
        return time.perf_counter() - start


def time_call(fn: Callable[[], Any], device: torch.device, *,
              setup: Callable[[], Any] | None = None, repeats: int = REPEATS,
              loop: bool = True) -> Timing:
    """Time ``fn()``: warm up (10 calls or 1 s, whichever ends first), then ``repeats``
    samples. With ``loop``, short calls are repeated ``inner`` times per sample; ``setup``
    (untimed) runs before each sample, e.g. a forward pass before a timed backward."""
    clock = _Clock(device)
    began = time.perf_counter()
    calls = 0
    one = 0.0
    while calls < WARMUP_ITERS and (calls < 2 or time.perf_counter() - began < WARMUP_S):
        if setup is not None:
            setup()
        synchronize(device)
        t = clock.start()
        fn()
        one = clock.elapsed(t)
        calls += 1
    inner = max(1, math.ceil(REGION_S / max(one, 1e-9))) if loop and setup is None else 1
    if one > LONG_REPEAT_S:
        repeats = min(repeats, MIN_REPEATS)
    samples = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        synchronize(device)
        t = clock.start()
        for _ in range(inner):
            fn()
        samples.append(clock.elapsed(t) / inner)
    return Timing.of(samples, inner)


def time_graph(fn: Callable[[], Any], device: torch.device, calls: int = 20,
               repeats: int = REPEATS) -> Timing:
    """Device time per call of ``fn``, with no host in the way: ``calls`` calls captured in
    one CUDA graph and replayed (what the device spends, however slow the host is)."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()  # warm up on a side stream, as graph capture requires
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    timing = time_call(graph.replay, device, repeats=repeats, loop=False)
    return Timing(timing.median_s / calls, timing.p10_s / calls, timing.p90_s / calls,
                  timing.repeats, calls)
