"""Results: a simulated step, and the whole training run it extrapolates to.

Every field names its unit. ``TrainingEstimate.to_json()`` is what ``gpusim estimate --json``
prints.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpusim import units
from gpusim.sim.trace import Trace

# Parts of the step breakdown printed only when the job has them (JSON keeps every key).
SHOWN_WHEN_USED = frozenset({"context_parallel_comm", "expert_parallel_comm"})


class StepResult(BaseModel):
    """One optimizer step on one device."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    step_time_s: float
    breakdown_s: dict[str, float] = Field(description="sums to step_time_s")
    samples_per_step: int
    tokens_per_sample: int | None
    model_flops_per_step: float
    peak_flops: float = Field(
        description="datasheet peak of the fastest unit the job's math uses (MFU's base)")
    peak_memory_bytes: float = Field(description="allocated peak (max_memory_allocated)")
    memory_breakdown_bytes: dict[str, float]
    kernels_per_step: int
    busy_fraction: float
    active_fraction: float = Field(
        description="share of the step the device works its bottleneck unit at the "
                    "attainable rate; sets the power drawn above idle")
    trace: Trace = Field(exclude=True, repr=False)
    num_gpus: int = 1
    parallel: str | None = Field(None, description="the split, for multi-GPU jobs")
    peak_reserved_bytes: float | None = Field(
        None, description="the caching allocator's reserved peak (max_memory_reserved)")
    memory_free_bytes: float | None = Field(
        None, description="what the device has left at the peak: what its driver gives a "
                          "process less what the job needs (allocated, stranded, context)")

    @property
    def samples_per_s(self) -> float:
        return self.samples_per_step / self.step_time_s

    @property
    def tokens_per_s(self) -> float | None:
        return self.samples_per_s * self.tokens_per_sample if self.tokens_per_sample else None

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization: model FLOP/s over the datasheet peak of every GPU."""
        return self.model_flops_per_step / self.step_time_s / (self.peak_flops * self.num_gpus)


# The share of a step spent waiting for input above which the summary says so in a line of
# its own (a small wait is within the model's noise; a tenth is a bottleneck to fix).
INPUT_BOUND_SHARE = 0.1


class TrainingEstimate(BaseModel):
    """A training run: the step, how many steps, and what they cost in time, money and energy."""

    model_config = ConfigDict(frozen=True)

    model: str
    device: str
    device_name: str
    batch_size: int
    precision: str
    step: StepResult
    steps: int
    price_usd_per_hour: float | None
    price_source: str | None
    average_power_w: float
    calibration: str
    assumptions: list[str]
    device_is_gpu: bool = True

    @property
    def time_to_train_s(self) -> float:
        return self.steps * self.step.step_time_s

    @property
    def num_gpus(self) -> int:
        return self.step.num_gpus

    @property
    def gpu_hours(self) -> float:
        return units.to_hours(self.time_to_train_s) * self.num_gpus

    @property
    def cost_usd(self) -> float | None:
        if self.price_usd_per_hour is None:
            return None
        return self.gpu_hours * self.price_usd_per_hour

    @property
    def energy_kwh(self) -> float:
        return units.to_kwh(self.average_power_w * self.num_gpus * self.time_to_train_s)

    def to_json(self) -> dict[str, Any]:
        """The estimate as one JSON object whose keys name their units."""
        s = self.step
        return {
            "model": self.model,
            "device": self.device,
            "device_name": self.device_name,
            "num_gpus": self.num_gpus,
            "parallel": s.parallel,
            "batch_size": self.batch_size,
            "precision": self.precision,
            "step_time_s": s.step_time_s,
            "samples_per_s": s.samples_per_s,
            "tokens_per_s": s.tokens_per_s,
            "steps": self.steps,
            "time_to_train_s": self.time_to_train_s,
            "gpu_hours": self.gpu_hours,
            "price_usd_per_hour": self.price_usd_per_hour,
            "price_source": self.price_source,
            "cost_usd": self.cost_usd,
            "average_power_w": self.average_power_w,
            "active_fraction": s.active_fraction,
            "energy_kwh": self.energy_kwh,
            "peak_memory_bytes": s.peak_memory_bytes,
            "peak_memory_per_gpu_bytes": s.peak_memory_bytes,
            "peak_reserved_bytes": s.peak_reserved_bytes,
            "memory_free_bytes": s.memory_free_bytes,
            "memory_breakdown_bytes": s.memory_breakdown_bytes,
            "mfu": s.mfu,
            "model_flops_per_step": s.model_flops_per_step,
            "kernels_per_step": s.kernels_per_step,
            "breakdown_s": s.breakdown_s,
            "calibration": self.calibration,
            "assumptions": self.assumptions,
        }

    def summary(self) -> str:
        """A short table for people."""
        s = self.step
        where = (f"{self.num_gpus} x {self.device_name} ({s.parallel})" if self.num_gpus > 1
                 else self.device_name)
        lines = [
            f"{self.model} on {where}, batch {self.batch_size}, {self.precision}",
            "",
            f"  step time        {units.human_seconds(s.step_time_s):>14}",
            f"  throughput       {s.samples_per_s:>14,.1f} samples/s",
        ]
        if s.tokens_per_s:
            lines.append(f"                   {s.tokens_per_s:>14,.0f} tokens/s")
        cost = f"${self.cost_usd:,.2f}" if self.cost_usd is not None else "n/a (no price)"
        price = (f" at ${self.price_usd_per_hour:.2f}/h ({self.price_source})"
                 if self.price_usd_per_hour is not None else "")
        lines += [
            f"  steps            {self.steps:>14,}",
            f"  time to train    {units.human_seconds(self.time_to_train_s):>14}",
            f"  {'GPU' if self.device_is_gpu else 'CPU'}-hours        {self.gpu_hours:>14,.2f} h",
            f"  cost             {cost:>14}{price}",
            f"  energy           {self.energy_kwh:>14,.2f} kWh "
            f"(average {self.average_power_w:.0f} W per device)",
            f"  peak memory      {units.human_bytes(s.peak_memory_bytes):>14}"
            + (" per GPU" if self.num_gpus > 1 else "") + " allocated"
            + (f", {units.human_bytes(s.peak_reserved_bytes)} reserved"
               if s.peak_reserved_bytes else "")
            + (_free(s.memory_free_bytes)
               if s.memory_free_bytes is not None and self.device_is_gpu else "")
            + " (gpusim memory: its parts)",
            f"  MFU              {100 * s.mfu:>13.1f} % of {s.peak_flops / 1e12:,.4g} TFLOP/s "
            "peak" + (" per GPU" if self.num_gpus > 1 else ""),
        ]
        waited = s.breakdown_s.get("input_pipeline", 0.0)
        if s.step_time_s and waited >= INPUT_BOUND_SHARE * s.step_time_s:
            lines.append(f"  input-bound      the data loaders set the pace: the device waits "
                         f"{100 * waited / s.step_time_s:.0f}% of each step for input. More "
                         f"loader workers (--loader-workers), a node with more CPU cores, "
                         f"or a cheaper input pipeline would speed it up")
        lines += ["", "  step breakdown"]
        for key, seconds in s.breakdown_s.items():
            if key in SHOWN_WHEN_USED and not seconds:
                continue
            share = 100 * seconds / s.step_time_s if s.step_time_s else 0.0
            lines.append(f"    {key.replace('_', ' '):<22}{units.human_seconds(seconds):>10}"
                         f"  {share:5.1f} %")
        lines += ["", f"  calibration: {self.calibration}", "  assumptions:"]
        lines += [f"    - {a}" for a in self.assumptions]
        return "\n".join(lines)


def _free(free_bytes: float) -> str:
    """What a GPU has left at the peak; a job that fits only if it fragments less than most
    is short of it at the median."""
    if free_bytes >= 0:
        return f", {units.human_bytes(free_bytes)} free"
    return (f", {units.human_bytes(-free_bytes)} short at the median fragmentation "
            "(fits, tightly)")
