"""Scaling curves: one estimate per GPU count, with throughput and scaling efficiency.

Weak scaling (``batch_size_per_gpu``) grows the global batch with the GPUs; strong scaling
(``batch_size``) keeps it fixed. A count that cannot run (out of memory, a split that does
not divide) is a row with ``fits`` false and its error, and the others go on.

>>> rows = scaling("gpt2", "h100-sxm", [1, 2], batch_size_per_gpu=4, precision="bf16",
...                seq_len=256)
>>> [(r.num_gpus, r.batch_size, r.fits) for r in rows], rows[0].efficiency
([(1, 4, True), (2, 8, True)], 1.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpusim.errors import GpusimError, InvalidConfig
from gpusim.estimation import estimate, resolve_model
from gpusim.hardware.catalog import load_device, load_system
from gpusim.hardware.profile import DeviceProfile
from gpusim.workload.model import Model


@dataclass(frozen=True)
class ScalingRow:
    """One GPU count. Throughputs and times are None when it does not run; ``efficiency``
    is its throughput per GPU over that of the smallest count that runs."""

    num_gpus: int
    batch_size: int  # global, per optimizer step
    step_time_s: float | None
    samples_per_s: float | None
    tokens_per_s: float | None
    efficiency: float | None
    fits: bool
    error: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _batches(num_gpus: Sequence[int], per_gpu: int | None,
             total: int | None) -> list[tuple[int, int]]:
    """(GPUs, global batch) for each count, ascending."""
    counts = sorted(set(num_gpus))
    if not counts or counts[0] < 1 or len(counts) != len(num_gpus):
        raise InvalidConfig(f"GPU counts must be distinct and at least 1 (got "
                            f"{', '.join(map(str, num_gpus)) or 'none'})")
    if per_gpu is not None and total is None:
        batches = [per_gpu * n for n in counts]
    elif total is not None and per_gpu is None:
        batches = [total] * len(counts)
    else:
        raise InvalidConfig("give either a batch per GPU (weak scaling) or a global batch "
                            "(strong scaling)")
    if batches[0] < 1:
        raise InvalidConfig(f"the batch size must be at least 1 (got {batches[0]})")
    return list(zip(counts, batches, strict=True))


def scaling(model: str | Model, gpu: str | DeviceProfile | None, num_gpus: Sequence[int], *,
            batch_size_per_gpu: int | None = None, batch_size: int | None = None,
            **options: Any) -> list[ScalingRow]:
    """Estimate one step at each GPU count (ascending), weak scaling with
    ``batch_size_per_gpu`` or strong scaling with a fixed global ``batch_size``;
    ``options`` are estimate() keywords (precision, tp, pp, system, loader_workers, ...).
    """
    points = _batches(num_gpus, batch_size_per_gpu, batch_size)
    # Names are looked up once, so a typo is an error rather than a row per count.
    net = resolve_model(model, options.pop("seq_len", None))
    device = load_device(gpu) if isinstance(gpu, str) else gpu
    if isinstance(options.get("system"), str):
        options["system"] = load_system(options["system"])
    rows: list[ScalingRow] = []
    base: float | None = None  # samples/s per GPU of the smallest count that runs
    for n, batch in points:
        try:
            step = estimate(net, device, batch, num_gpus=n, **options).step
        except GpusimError as exc:
            rows.append(ScalingRow(n, batch, None, None, None, None, False, exc.summary))
            continue
        per_gpu_s = step.samples_per_s / n
        base = base or per_gpu_s
        rows.append(ScalingRow(n, batch, step.step_time_s, step.samples_per_s,
                               step.tokens_per_s, per_gpu_s / base, True, None))
    return rows
