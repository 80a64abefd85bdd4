"""The front door: ``estimate(model=..., gpu=..., ...)`` runs the whole pipeline.

job -> memory plan (OutOfMemory if it does not fit) -> step plan -> simulation -> estimate
of the run (steps, time, cost, energy), with the assumptions it made.
"""

from __future__ import annotations

import math
from pathlib import Path

from gpusim.errors import InvalidConfig
from gpusim.hardware.calibration import Calibration, calibration_for
from gpusim.hardware.catalog import load_device
from gpusim.hardware.profile import DeviceProfile
from gpusim.plan.job import Checkpointing, Optimizer, TrainingJob, TrainingPrecision
from gpusim.plan.lower import lower
from gpusim.plan.memory import check_fits, memory_plan
from gpusim.report import StepResult, TrainingEstimate
from gpusim.sim.engine import simulate
from gpusim.workload import formats, zoo
from gpusim.workload.model import Model


def resolve_model(model: str | Model, seq_len: int | None = None) -> Model:
    """A Model from a zoo name, a YAML file path, or a Model (returned as is)."""
    if isinstance(model, Model):
        return model
    if model.endswith((".yaml", ".yml")) or Path(model).is_file():
        return formats.load_model_file(model, seq_len)
    return zoo.get(model, seq_len)


def training_steps(model: Model, batch_size: int, *, epochs: float | None = None,
                   dataset_size: int | None = None, tokens: float | None = None,
                   steps: int | None = None) -> int:
    """Optimizer steps for the run: from steps, tokens, or epochs over a dataset."""
    given = [x is not None for x in (steps, tokens, epochs)]
    if sum(given) != 1:
        raise InvalidConfig("give exactly one of --steps, --tokens, or --epochs with "
                            "--dataset-size")
    if steps is not None:
        if steps <= 0:
            raise InvalidConfig(f"steps must be positive (got {steps})")
        return steps
    if tokens is not None:
        if not model.tokens_per_sample:
            raise InvalidConfig(f"{model.name} does not take tokens; use --epochs or --steps")
        if tokens <= 0:
            raise InvalidConfig(f"tokens must be positive (got {tokens:g})")
        return math.ceil(tokens / (model.tokens_per_sample * batch_size))
    assert epochs is not None
    if dataset_size is None:
        raise InvalidConfig("--epochs needs --dataset-size (samples per epoch)")
    if epochs <= 0 or dataset_size <= 0:
        raise InvalidConfig("epochs and dataset size must be positive")
    return math.ceil(epochs * dataset_size / batch_size)


def simulate_step(job: TrainingJob, calibration: Calibration | None = None) -> StepResult:
    """Simulate one optimizer step of ``job`` (raises OutOfMemory if it does not fit);
    ``calibration`` replaces the device's own, e.g. one fitted on another GPU."""
    mem = memory_plan(job)
    check_fits(job, mem)
    plan = lower(job, calibration)
    sim = simulate(plan, on_gpu=job.device.is_gpu)
    peak, _ = job.device.peak_flops(job.numerics().matmul, matrix=True)  # type: ignore[arg-type]
    return StepResult(
        step_time_s=sim.step_time_s,
        breakdown_s=sim.breakdown_s,
        samples_per_step=job.batch_size,
        tokens_per_sample=job.model.tokens_per_sample,
        model_flops_per_step=plan.model_flops_per_step,
        peak_flops=peak,
        peak_memory_bytes=mem.peak_bytes,
        memory_breakdown_bytes=mem.breakdown(),
        kernels_per_step=sim.kernels_per_step,
        busy_fraction=sim.busy_s / sim.step_time_s if sim.step_time_s else 0.0,
        trace=sim.trace,
    )


def _assumptions(job: TrainingJob) -> list[str]:
    num = job.numerics()
    out = [f"matrix products in {num.matmul}, convolutions in {num.conv}, activations in "
           f"{num.activation}; weights, gradients and optimizer states in fp32"]
    if job.precision == "fp32" and num.conv == "tf32":
        out.append("PyTorch defaults: cuDNN may use TF32 for fp32 convolutions, cuBLAS may not")
    if job.loader_workers:
        inp = job.model.input
        out.append(f"input: {inp.description}; {job.loader_workers} loader workers at "
                   f"{inp.loader_cpu_s * 1e3:.3g} ms CPU per sample")
    else:
        out.append("input: synthetic data already on the device (no loader, no copy)")
    if job.grad_accum > 2:
        out.append(f"{job.grad_accum} microbatches: 2 simulated in detail, the rest repeat the "
                   "last")
    out.append("PyTorch eager execution, one kernel per op, no CUDA graphs; a host "
               "synchronize at the end of each step")
    out.append("energy: idle power plus the busy fraction of (TDP - idle power)")
    return out


def estimate(
    model: str | Model,
    gpu: str | DeviceProfile,
    batch_size: int,
    *,
    precision: TrainingPrecision = "fp32",
    epochs: float | None = None,
    dataset_size: int | None = None,
    tokens: float | None = None,
    steps: int | None = None,
    seq_len: int | None = None,
    grad_accum: int = 1,
    optimizer: Optimizer = "adam",
    checkpointing: Checkpointing = "none",
    frozen: tuple[str, ...] = (),
    loader_workers: int = 8,
) -> TrainingEstimate:
    """Predict a training run of ``model`` on one ``gpu`` (a GPU or CPU profile).

    The run's length comes from exactly one of ``steps``, ``tokens`` (language models) or
    ``epochs`` with ``dataset_size``; with none, one step is estimated.
    """
    device = gpu if isinstance(gpu, DeviceProfile) else load_device(gpu)
    net = resolve_model(model, seq_len)
    if steps is None and tokens is None and epochs is None:
        steps = 1
    n_steps = training_steps(net, batch_size, epochs=epochs, dataset_size=dataset_size,
                             tokens=tokens, steps=steps)
    job = TrainingJob(net, device, batch_size, precision, grad_accum, optimizer, checkpointing,
                      frozen, loader_workers)
    step = simulate_step(job)
    cal = calibration_for(device)
    idle = cal.idle_power_fraction * device.tdp_w
    power = idle + (device.tdp_w - idle) * step.busy_fraction
    quote = device.cloud_price_usd_per_hour()
    return TrainingEstimate(
        model=net.name,
        device=device.name,
        device_name=device.full_name,
        batch_size=batch_size,
        precision=precision,
        step=step,
        steps=n_steps,
        price_usd_per_hour=quote.usd_per_hour if quote else None,
        price_source=f"{quote.provider}, {quote.date}" if quote else None,
        average_power_w=power,
        calibration=f"{cal.name} ({cal.status})",
        assumptions=_assumptions(job),
    )
