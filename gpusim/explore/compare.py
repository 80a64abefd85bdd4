"""Compare devices on one training job: time to train, cost to rent and to own, energy.

Every device trains the same job (the same model, global batch and run length). Each finds
its own way to fit: one device tries gradient accumulation and activation recomputation;
many GPUs take the fastest split ``search`` finds. A device on which nothing fits is kept in
the table with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpusim import units
from gpusim.comm.topology import Topology, system_for_gpu
from gpusim.errors import GpusimError, OutOfMemory
from gpusim.estimation import estimate, resolve_model
from gpusim.explore.search import search
from gpusim.hardware.catalog import load_device
from gpusim.hardware.profile import DeviceProfile, GPUProfile
from gpusim.plan.job import (
    DEFAULT_LOADER_WORKERS,
    Checkpointing,
    auto_precision,
)
from gpusim.pricing import Pricing, RunCost, run_cost
from gpusim.report import TrainingEstimate
from gpusim.workload.model import Model

# Global batch when none is given: per device, for language models and for the rest.
DEFAULT_BATCH_PER_DEVICE = {"transformer": 16, "other": 128}
SORT_KEYS = ("time", "cost", "ownership", "energy")


@dataclass(frozen=True)
class Comparison:
    """One device's row: the run it fits, what it costs, or why it does not run."""

    device: DeviceProfile
    num_devices: int
    result: TrainingEstimate | None
    cost: RunCost | None
    setup: str  # how the job was fitted: accumulation and recompute, or the split
    reason: str | None = None  # why it does not run

    @property
    def fits(self) -> bool:
        return self.result is not None

    @property
    def tight(self) -> bool:
        """Short of memory at the median fragmentation: it runs only if it fragments little."""
        free = self.result.step.memory_free_bytes if self.result else None
        return free is not None and free < 0

    @property
    def time_to_train_s(self) -> float | None:
        return self.result.time_to_train_s if self.result else None

    def value(self, key: str) -> float | None:
        """The figure a sort key names (lower is better); None sorts last."""
        if self.result is None or self.cost is None:
            return None
        return {"time": self.result.time_to_train_s, "cost": self.cost.cloud_usd,
                "ownership": self.cost.ownership_usd,
                "energy": self.result.energy_kwh}[key]

    def to_json(self) -> dict[str, Any]:
        r, c = self.result, self.cost
        tdp = self.device.tdp_w * self.num_devices
        row: dict[str, Any] = {
            "gpu": self.device.name, "gpu_name": self.device.full_name,
            "kind": "gpu" if self.device.is_gpu else "cpu", "num_devices": self.num_devices,
            "fits": self.fits, "reason": self.reason, "setup": self.setup,
            "batch_size": r.batch_size if r else None,
            "step_time_s": r.step.step_time_s if r else None,
            "samples_per_s": r.step.samples_per_s if r else None,
            "tokens_per_s": r.step.tokens_per_s if r else None,
            "time_to_train_s": r.time_to_train_s if r else None,
            "cost_usd": c.cloud_usd if c else None,
            "cloud_usd_per_device_hour": c.cloud_usd_per_device_hour if c else None,
            "cloud_price_source": c.cloud_source if c else None,
            "ownership_cost_usd": c.ownership_usd if c else None,
            "purchase_usd": c.purchase_usd if c else None,
            "purchase_price_source": c.purchase_source if c else None,
            "energy_kwh": r.energy_kwh if r else None,
            "facility_energy_kwh": c.facility_energy_kwh if c else None,
            "electricity_usd": c.electricity_usd if c else None,
            "average_power_w": r.average_power_w * self.num_devices if r else None,
            "tdp_w": tdp,
            "peak_memory_per_device_bytes": r.step.peak_memory_bytes if r else None,
            "memory_tight": self.tight,
            "mfu": r.step.mfu if r else None,
            "calibration": r.calibration if r else None,
        }
        if r and c and c.cloud_usd:
            row["samples_per_usd"] = r.steps * r.batch_size / c.cloud_usd
        if r:
            row["samples_per_s_per_kw"] = r.step.samples_per_s / (row["average_power_w"] / 1e3)
        return row


def default_batch(model: Model, num_devices: int) -> int:
    per = DEFAULT_BATCH_PER_DEVICE["transformer" if model.tokens_per_sample else "other"]
    return per * num_devices


def _fit_one(model: Model, device: DeviceProfile, batch: int,
             options: dict[str, Any]) -> tuple[TrainingEstimate, str]:
    """The fastest run on one device: for each recompute mode, the least gradient
    accumulation that fits."""
    modes: list[Checkpointing] = ["none", "full"]
    if model.tokens_per_sample:
        modes.insert(1, "selective")
    if "checkpointing" in options:
        modes = [options.pop("checkpointing")]
    best: tuple[TrainingEstimate, str] | None = None
    last: OutOfMemory | None = None
    for mode in modes:
        accum = 1
        while accum <= batch:
            if batch % accum == 0:
                try:
                    result = estimate(model, device, batch, grad_accum=accum,
                                      checkpointing=mode, **options)
                except OutOfMemory as exc:
                    last = exc
                    accum *= 2
                    continue
                setup = f"microbatch {batch // accum}" + (f" x {accum} accumulated"
                                                          if accum > 1 else "")
                if mode != "none":
                    setup += f", recompute {mode}"
                # a later (costlier) mode must win clearly, not by rounding
                if best is None or result.time_to_train_s < 0.995 * best[0].time_to_train_s:
                    best = (result, setup)
                break
            accum *= 2
    if best is None:
        assert last is not None
        raise last
    return best


def _fit_many(model: Model, gpu: GPUProfile, num: int, batch: int,
              options: dict[str, Any]) -> tuple[TrainingEstimate, str]:
    """The fastest split of ``num`` GPUs that fits, as ``search`` ranks them."""
    system, _ = system_for_gpu(gpu)
    topology = Topology.build(system, num, gpu)
    precision = options["precision"]
    found = search(model, topology, batch, precision=precision,
                   optimizer=options.get("optimizer", "adam"), top=3,
                   loader_workers=options.get("loader_workers", DEFAULT_LOADER_WORKERS))
    if not found.ranked:
        why = found.rejected[0][1] if found.rejected else "no split divides the job"
        raise GpusimError(f"no split of {num} x {gpu.name} fits: {why}")
    best = found.ranked[0]
    c = best.config
    result = estimate(model, gpu, batch, num_gpus=num, tp=c.tensor, pp=c.pipeline,
                      dp=c.data, microbatch_size=c.microbatch_size, schedule=c.schedule,
                      virtual_stages=c.virtual_stages, zero=c.zero,
                      sequence_parallel=c.sequence_parallel, checkpointing=best.checkpointing,
                      **{k: v for k, v in options.items() if k != "checkpointing"})
    return result, f"{c.describe()}, recompute {best.checkpointing}"


def compare_one(model: Model, device: DeviceProfile, num_devices: int, batch: int,
                pricing: Pricing, options: dict[str, Any]) -> Comparison:
    """One row: the device fitted to the job, or the reason it cannot run it. Precision
    "auto" (the default) takes the device's fastest mixed precision."""
    options = dict(options)
    auto = options.get("precision", "auto") == "auto"
    if auto:
        options["precision"] = auto_precision(device)
    try:
        if num_devices == 1:
            result, setup = _fit_one(model, device, batch, options)
        elif not isinstance(device, GPUProfile):
            raise GpusimError("a CPU trains alone here; compare CPUs with one device")
        else:
            result, setup = _fit_many(model, device, num_devices, batch, options)
    except GpusimError as exc:
        return Comparison(device, num_devices, None, None, "", exc.summary.split(";")[0])
    if auto:
        setup = f"{options['precision']}, {setup}"
    return Comparison(device, num_devices, result, run_cost(result, device, pricing), setup)


Devices = Sequence[str | DeviceProfile | tuple[str | DeviceProfile, int]]


def device_counts(devices: Devices, num_devices: int) -> list[tuple[DeviceProfile, int]]:
    """Each device with its count: ``"rtx-4090:8"`` or ``(profile, 8)`` names its own,
    a bare name or profile takes ``num_devices``."""
    out = []
    for item in devices:
        count = num_devices
        if isinstance(item, tuple):
            item, count = item
        elif isinstance(item, str) and ":" in item:
            item, _, text = item.rpartition(":")
            if not text.strip().isascii() or not text.strip().isdigit():
                raise GpusimError(f"a device count is a whole number, as in rtx-4090:8 "
                                  f"(got {text!r} after {item!r})")
            count = int(text)
        if count < 1:
            raise GpusimError(f"a device count must be at least 1 (got {count})")
        out.append((item if isinstance(item, DeviceProfile) else load_device(item), count))
    return out


def compare(model: str | Model, devices: Devices, *,
            num_devices: int = 1, batch_size: int | None = None, sort: str = "time",
            pricing: Pricing | None = None,
            progress: Callable[[int, int, str], None] | None = None,
            **options: Any) -> list[Comparison]:
    """Rank ``devices`` on one job, best first by ``sort`` (time, cost, ownership or
    energy). A device is a profile or its name, with its own count as ``"name:8"`` or
    ``(name, 8)`` (setups buyers compare, such as eight RTX 4090s against two H100s);
    otherwise ``num_devices`` of it. ``options`` are estimate() keywords (precision,
    tokens, seq_len, ...). The global batch is the same for every setup (default: the
    largest setup's default)."""
    if sort not in SORT_KEYS:
        raise GpusimError(f"sort by one of {', '.join(SORT_KEYS)} (got {sort!r})")
    if num_devices < 1:
        raise GpusimError(f"--num-gpus must be at least 1 (got {num_devices})")
    net = resolve_model(model, options.pop("seq_len", None))
    setups = device_counts(devices, num_devices)
    batch = batch_size or default_batch(net, max(n for _, n in setups))
    pricing = pricing or Pricing()
    rows = []
    for i, (device, count) in enumerate(setups):
        if progress:
            progress(i, len(setups), device.name)
        rows.append(compare_one(net, device, count, batch, pricing, options))
    if progress:
        progress(len(setups), len(setups), "")
    return rank(rows, sort)


def rank(rows: list[Comparison], sort: str) -> list[Comparison]:
    """Rows that run, best first by ``sort``; rows without the figure, then those that do
    not run, last."""
    def key(row: Comparison) -> tuple[int, float]:
        value = row.value(sort)
        return (0 if value is not None else 1 if row.fits else 2,
                value if value is not None else row.time_to_train_s or 0.0)
    return sorted(rows, key=key)


def affordable(device: DeviceProfile, budget_usd: float, pricing: Pricing,
               max_devices: int) -> int:
    """The most devices (a power of two, at most ``max_devices``) the budget buys; 0 when
    one is over budget or the device has no price."""
    quote = device.purchase_price()
    if quote is None:
        return 0
    each = quote.usd + pricing.host_usd_per_gpu
    if each > budget_usd:
        return 0
    n = 1
    while 2 * n * each <= budget_usd and 2 * n <= max_devices:
        n *= 2
    return n


def budget(model: str | Model, devices: Sequence[str | DeviceProfile], budget_usd: float, *,
           max_devices: int = 64, batch_size: int | None = None,
           pricing: Pricing | None = None,
           progress: Callable[[int, int, str], None] | None = None,
           **options: Any) -> tuple[list[Comparison], list[str]]:
    """For each device, as many as ``budget_usd`` buys, trained on the same job; ranked by
    time to train, with the reasons the best one wins."""
    if budget_usd <= 0:
        raise GpusimError(f"--budget-usd must be positive (got {budget_usd:g})")
    pricing = pricing or Pricing()
    net = resolve_model(model, options.pop("seq_len", None))
    profiles = [d if isinstance(d, DeviceProfile) else load_device(d) for d in devices]
    counts = {p.name: affordable(p, budget_usd, pricing, max_devices) for p in profiles}
    batch = batch_size or default_batch(net, max(counts.values(), default=1) or 1)
    rows = []
    for i, device in enumerate(profiles):
        if progress:
            progress(i, len(profiles), device.name)
        n = counts[device.name]
        if n == 0:
            quote = device.purchase_price()
            why = (f"one costs ${quote.usd + pricing.host_usd_per_gpu:,.0f}, over the budget"
                   if quote else "no purchase price in its profile")
            rows.append(Comparison(device, 0, None, None, "", why))
            continue
        if n > 1 and not isinstance(device, GPUProfile):
            n = 1  # CPUs train alone here
        rows.append(compare_one(net, device, n, batch, pricing, options))
    if progress:
        progress(len(profiles), len(profiles), "")
    ranked = rank(rows, "time")
    return ranked, explain_budget(ranked, budget_usd)


def _peak_pflops(row: Comparison) -> float:
    assert row.result is not None
    return row.result.step.peak_flops * row.num_devices / 1e15


def explain_budget(rows: list[Comparison], budget_usd: float) -> list[str]:
    """Why the best row wins: what the budget buys of each, and where each loses time."""
    fitting = [r for r in rows if r.fits]
    if not fitting:
        return [f"nothing in the list trains this job for ${budget_usd:,.0f}: "
                + "; ".join(f"{r.device.name}: {r.reason}" for r in rows)]
    best = fitting[0]
    assert best.result is not None and best.cost is not None
    spent = best.cost.purchase_usd or 0.0
    lines = [f"best: {best.num_devices} x {best.device.name} for ${spent:,.0f} of "
             f"${budget_usd:,.0f} trains in {_hours(best)}; it buys {_peak_pflops(best):.2f} "
             f"PFLOP/s of peak and uses {100 * best.result.step.mfu:.0f}% of it (MFU)"]
    for r in fitting[1:]:
        assert r.result is not None
        slower = r.result.time_to_train_s / best.result.time_to_train_s
        why = []
        if _peak_pflops(r) < _peak_pflops(best):
            why.append(f"buys less peak ({_peak_pflops(r):.2f} PFLOP/s)")
        if r.result.step.mfu < best.result.step.mfu:
            exposed = sum(v for k, v in r.result.step.breakdown_s.items()
                          if k.endswith("_comm") or k == "pipeline_bubble")
            share = 100 * exposed / r.result.step.step_time_s
            why.append(f"uses less of it ({100 * r.result.step.mfu:.0f}% MFU"
                       + (f"; communication and bubbles {share:.0f}% of the step)"
                          if share >= 1 else ")"))
        if "recompute" in r.setup and "recompute none" not in r.setup:
            why.append("must recompute activations to fit")
        lines.append(f"{r.num_devices} x {r.device.name}: {_hours(r)}, {slower:.2f}x slower"
                     + (f": {', '.join(why)}" if why else ""))
    lines += [f"{r.device.name}: {r.reason}" for r in rows if not r.fits]
    return lines


def _hours(row: Comparison) -> str:
    assert row.time_to_train_s is not None
    return units.human_seconds(row.time_to_train_s)
