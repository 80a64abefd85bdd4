"""The front door: ``estimate(model=..., gpu=..., ...)`` runs the whole pipeline.

job -> memory plan (OutOfMemory if it does not fit) -> step plan -> simulation -> estimate
of the run (steps, time, cost, energy), with the assumptions it made.
"""

from __future__ import annotations

import math
from typing import Literal

from gpusim import units
from gpusim.assumptions import (
    OFFLOAD_TEXT,
    attention_unmeasured,
    parallel_assumptions,
    single_assumptions,
)
from gpusim.cost.energy import average_power_w
from gpusim.errors import InvalidConfig
from gpusim.hardware.calibration import Calibration, calibration_for
from gpusim.hardware.profile import DeviceProfile, PriceQuote, SystemProfile
from gpusim.plan.activation_offload import BREAKDOWN_KEY as OFFLOAD_KEY
from gpusim.plan.activation_offload import exposed_seconds, offload_split
from gpusim.plan.build import (  # the job's construction, re-exported (__all__)
    build_job,
    replace_layers,
    resolve_model,
    resolve_topology,
)
from gpusim.plan.job import (
    AUTO_PRECISION,
    DEFAULT_LOADER_WORKERS,
    Checkpointing,
    Optimizer,
    TrainingJob,
    TrainingPrecision,
)
from gpusim.plan.lower import lower
from gpusim.plan.memory import MemoryPlan, activations_by_layer, memory_plan
from gpusim.plan.parallel import ParallelPlan, plan_parallel
from gpusim.plan.parallel_job import ParallelJob
from gpusim.plan.remedies import check_fits, check_fits_parallel
from gpusim.plan.stage_memory import stage_memory
from gpusim.report import StepResult, TrainingEstimate
from gpusim.sim.engine import simulate
from gpusim.sim.pipeline import simulate_pipeline
from gpusim.sim.ranks import Straggler
from gpusim.stack import Stack, load_stack
from gpusim.workload.attention import Attention
from gpusim.workload.layers import Conv2d
from gpusim.workload.lora import LORA_SUFFIX
from gpusim.workload.model import Model
from gpusim.workload.moe import MoE
from gpusim.workload.numerics import Numerics

__all__ = ["build_job", "estimate", "mfu_peak", "replace_layers", "resolve_model",
           "resolve_topology", "simulate_parallel_step", "simulate_step", "training_steps"]

# A run longer than this many optimizer steps is a typing slip (10^12 steps of one second
# each is 30,000 years); the totals it would print mean nothing.
LARGEST_STEPS = 10**12


def training_steps(model: Model, batch_size: int, *, epochs: float | None = None,
                   dataset_size: int | None = None, tokens: float | None = None,
                   steps: int | None = None) -> int:
    """Optimizer steps for the run: from steps, tokens, or epochs over a dataset."""
    if batch_size <= 0:
        raise InvalidConfig(f"batch size must be positive (got {batch_size})")
    for name, value in (("tokens", tokens), ("epochs", epochs)):
        if value is not None and not math.isfinite(value):
            raise InvalidConfig(f"{name} must be a finite number (got {value})")
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
        steps_needed = math.ceil(tokens / (model.tokens_per_sample * batch_size))
        if steps_needed > LARGEST_STEPS:
            raise InvalidConfig(f"{tokens:g} tokens make {steps_needed:.3g} steps, beyond "
                                f"reason (at most {LARGEST_STEPS:.0e})")
        return steps_needed
    assert epochs is not None
    if dataset_size is None:
        raise InvalidConfig("--epochs needs --dataset-size (samples per epoch)")
    if epochs <= 0 or dataset_size <= 0:
        raise InvalidConfig("epochs and dataset size must be positive")
    steps_needed = math.ceil(epochs * dataset_size / batch_size)
    if steps_needed > LARGEST_STEPS:
        raise InvalidConfig(f"{epochs:g} epochs of {dataset_size} samples make "
                            f"{steps_needed:.3g} steps, beyond reason (at most "
                            f"{LARGEST_STEPS:.0e})")
    return steps_needed


def mfu_peak(device: DeviceProfile, model: Model, num: Numerics) -> float:
    """The peak MFU is measured against: that of the fastest unit the job's math runs on.
    PyTorch lets cuDNN run fp32 convolutions in TF32, so an fp32 CNN is held to the TF32
    tensor-core peak, not the fp32 one it would exceed."""
    maths = {num.matmul}
    if any(isinstance(layer, Conv2d) for layer in model.layers):
        maths.add(num.conv)
    return max(device.peak_flops(m, matrix=True)[0] for m in maths)  # type: ignore[arg-type]


def simulate_step(job: TrainingJob, calibration: Calibration | None = None) -> StepResult:
    """Simulate one optimizer step of ``job`` (raises OutOfMemory if it does not fit);
    ``calibration`` replaces the device's own, e.g. one fitted on another GPU."""
    mem = memory_plan(job)
    check_fits(job, mem)
    plan = lower(job, calibration)
    sim = simulate(plan, on_gpu=job.device.is_gpu)
    step_time_s, breakdown_s = sim.step_time_s, dict(sim.breakdown_s)
    if job.offload_activations:  # the copies beside compute: only what it cannot cover
        offloaded = offload_split(job, activations_by_layer(job)[0])[0]
        exposed = exposed_seconds(job, offloaded, breakdown_s, plan.calibration)
        breakdown_s[OFFLOAD_KEY] = exposed
        step_time_s += exposed
    return StepResult(
        step_time_s=step_time_s,
        breakdown_s=breakdown_s,
        samples_per_step=job.batch_size,
        tokens_per_sample=job.model.tokens_per_sample,
        model_flops_per_step=plan.model_flops_per_step,
        peak_flops=mfu_peak(job.device, job.model, job.numerics()),
        peak_memory_bytes=mem.peak_bytes,
        peak_reserved_bytes=mem.reserved_bytes,
        memory_free_bytes=mem.free_bytes,
        memory_breakdown_bytes=mem.breakdown(),
        kernels_per_step=sim.kernels_per_step,
        busy_fraction=sim.busy_s / step_time_s if step_time_s else 0.0,
        active_fraction=plan.active_s_per_step / step_time_s if step_time_s else 0.0,
        trace=sim.trace,
    )


# Passes --per-rank simulates in under a minute on a small machine; beyond, the request is
# refused up front. Measured on two cores (2026-11-23, the per-instant clock): GPT-3 175B on
# 32,768 A100s, 1,572,864 passes over 4,096 units, 24 s and 0.7 GB; on 98,304 A100s,
# 393,216 passes over 12,288 units, 33 s and 0.8 GB (time grows with the units as well).
PER_RANK_PASSES = 1_600_000


def simulate_parallel_step(job: ParallelJob, calibration: Calibration | None = None, *,
                           trace: bool = True, per_rank: bool = False,
                           straggler: Straggler | None = None,
                           comm_slowdown: float | None = None,
                           planned: tuple[ParallelPlan, list[MemoryPlan]] | None = None
                           ) -> StepResult:
    """Simulate one step of a multi-GPU job (raises OutOfMemory if a stage does not fit);
    ``per_rank`` simulates every data-parallel replica, a ``straggler`` slows one rank,
    ``comm_slowdown`` slows kernels while a data-parallel collective runs beside them
    (None: the published average, gpusim.sim.pipeline.COMM_SLOWDOWN). ``planned``: the
    job's plan and every stage's memory where the caller has them (a search)."""
    if planned is None:
        plan = plan_parallel(job, calibration)
        mems = [stage_memory(plan, stage) for stage in plan.stages]
    else:
        plan, mems = planned
    check_fits_parallel(job, mems)
    if per_rank:
        p = job.parallel
        passes = 2 * p.data * p.pipeline * p.virtual_stages * plan.microbatches
        if passes > PER_RANK_PASSES:
            raise InvalidConfig(
                f"--per-rank would simulate {passes:,} passes (every replica's every "
                f"microbatch), more than the {PER_RANK_PASSES:,} it runs (about a minute); "
                f"leave out --per-rank (one replica per stage stands for all, exactly so when "
                f"no rank is slower), or use fewer GPUs")
    sim = simulate_pipeline(plan, trace=trace, per_rank=per_rank, straggler=straggler,
                            comm_slowdown=comm_slowdown)
    worst = max(mems, key=lambda m: m.peak_bytes)
    kernels = sum(c.forward.kernels + c.backward.kernels for c in plan.stages[0].chunks)
    return StepResult(
        step_time_s=sim.step_time_s,
        breakdown_s=sim.breakdown_s,
        samples_per_step=job.batch_size,
        tokens_per_sample=job.model.tokens_per_sample,
        model_flops_per_step=job.batch_size * job.model_flops_per_sample,
        peak_flops=mfu_peak(job.topology.gpu, job.model, job.whole.numerics()),
        peak_memory_bytes=worst.peak_bytes,
        peak_reserved_bytes=worst.reserved_bytes,
        memory_free_bytes=worst.free_bytes,
        memory_breakdown_bytes=worst.breakdown(),
        kernels_per_step=kernels * job.microbatches,
        busy_fraction=sim.busy_fraction,
        active_fraction=plan.active_s_per_step / sim.step_time_s if sim.step_time_s else 0.0,
        trace=sim.trace,
        num_gpus=job.topology.num_gpus,
        parallel=job.parallel.describe(),
    )


def _quote_source(quote: PriceQuote) -> str:
    size = (f"per GPU of a {quote.instance_gpus}-GPU instance" if quote.instance_gpus > 1
            else "a single-device rental")
    return f"{quote.provider}, {quote.date}, {size}"


def estimate(
    model: str | Model,
    gpu: str | DeviceProfile | None,
    batch_size: int,
    *,
    precision: TrainingPrecision | Literal["auto"] = "auto",
    epochs: float | None = None,
    dataset_size: int | None = None,
    tokens: float | None = None,
    steps: int | None = None,
    seq_len: int | None = None,
    grad_accum: int = 1,
    optimizer: Optimizer = "adam",
    checkpointing: Checkpointing = "none",
    frozen: tuple[str, ...] = (),
    loader_workers: int = DEFAULT_LOADER_WORKERS,
    num_gpus: int = 1,
    system: str | SystemProfile | None = None,
    tp: int = 1,
    pp: int = 1,
    dp: int | None = None,
    cp: int = 1,
    ep: int = 1,
    etp: int = 0,
    microbatch_size: int | None = None,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    pp_layers: tuple[int, ...] = (),
    pp_layout: str = "",
    shard_group: int = 0,
    zero: int = 0,
    sequence_parallel: bool = False,
    tp_overlap: bool = False,
    ep_overlap: bool = False,
    ep_dispatcher: str = "alltoall",
    moe_imbalance: float = 1.0,
    moe_capacity: float = 0.0,
    moe_pad: bool = False,
    overlap_grad_reduce: bool = True,
    bf16_grads: bool = False,
    bf16_states: bool = False,
    per_rank: bool = False,
    straggler: Straggler | None = None,
    usd_per_gpu_hour: float | None = None,
    comm_slowdown: float | None = None,
    max_batch: bool = False,
    pure_bf16: bool = False,
    stack: str | Stack | None = None,
    attention: str | None = None,
    fp8_recipe: str = "tensorwise",
    offload: str = "none",
    optimizer_in_backward: bool = False,
    offload_activations: bool = False,
    finetune: str = "full",
    lora_rank: int = 8,
    lora_targets: str | tuple[str, ...] = ("q", "v"),
    lora_dropout: bool = False,
    channels_last: bool = False,
    power_limit_w: float | None = None,
    compile: bool = False,
) -> TrainingEstimate:
    """Predict a training run of ``model`` on one ``gpu`` (a GPU or CPU profile), or on
    ``num_gpus`` GPUs of a ``system`` split by ``tp`` x ``cp`` x ``pp`` x ``dp`` (see
    ParallelConfig; ``cp`` splits each sequence, gpusim.plan.context_parallel).

    ``batch_size`` is the global batch per optimizer step. The run's length comes from
    exactly one of ``steps``, ``tokens`` (language models) or ``epochs`` with
    ``dataset_size``; with none, one step is estimated. ``per_rank`` and ``straggler`` (one
    slow GPU or link) and ``comm_slowdown`` apply to multi-GPU jobs. ``max_batch`` runs
    the largest microbatch that fits and divides the batch (see ``build_job``).
    ``usd_per_gpu_hour`` prices the run at your rate instead of the profile's cheapest
    listed cloud price. ``optimizer_in_backward`` and ``offload_activations`` are torchtune's
    memory savers, ``bf16_grads`` Megatron-LM's --grad-reduce-in-bf16, ``bf16_states`` the
    optimizer's states in bf16 (see ``build_job``).
    """
    if steps is None and tokens is None and epochs is None:
        steps = 1
    job, assumed = build_job(
        model, gpu, batch_size, precision=precision, seq_len=seq_len, grad_accum=grad_accum,
        optimizer=optimizer, checkpointing=checkpointing, frozen=frozen,
        loader_workers=loader_workers, num_gpus=num_gpus, system=system, tp=tp, pp=pp, dp=dp,
        cp=cp, ep=ep, etp=etp, microbatch_size=microbatch_size, schedule=schedule,
        virtual_stages=virtual_stages,
        pp_layers=pp_layers, pp_layout=pp_layout, shard_group=shard_group,
        zero=zero, sequence_parallel=sequence_parallel, tp_overlap=tp_overlap,
        ep_overlap=ep_overlap, ep_dispatcher=ep_dispatcher, moe_imbalance=moe_imbalance,
        moe_capacity=moe_capacity, moe_pad=moe_pad,
        overlap_grad_reduce=overlap_grad_reduce, bf16_grads=bf16_grads,
        bf16_states=bf16_states, max_batch=max_batch,
        pure_bf16=pure_bf16, stack=stack, attention=attention, fp8_recipe=fp8_recipe,
        offload=offload,
        optimizer_in_backward=optimizer_in_backward, offload_activations=offload_activations,
        finetune=finetune,
        lora_rank=lora_rank, lora_targets=lora_targets, lora_dropout=lora_dropout,
        channels_last=channels_last, power_limit_w=power_limit_w, compile=compile)
    n_steps = training_steps(job.model, batch_size, epochs=epochs, dataset_size=dataset_size,
                             tokens=tokens, steps=steps)
    if isinstance(job, ParallelJob):
        step = simulate_parallel_step(job, per_rank=per_rank, straggler=straggler,
                                      comm_slowdown=comm_slowdown)
        device: DeviceProfile = job.topology.gpu
        assumptions = parallel_assumptions(job, assumed, per_rank, straggler, comm_slowdown)
    else:
        if per_rank or straggler is not None or comm_slowdown is not None:
            raise InvalidConfig("--per-rank, --straggler, --slow-link and --comm-slowdown "
                                "apply to multi-GPU jobs (give --num-gpus)")
        device = job.device
        step = simulate_step(job)
        assumptions = single_assumptions(job)
    if offload != "none":
        assumptions.insert(0, OFFLOAD_TEXT[offload])
    if finetune != "full":
        adapters = [la for la in job.model.layers if la.name.endswith(LORA_SUFFIX)]
        base = ("its frozen projections in 4-bit NF4, dequantized before each product"
                if finetune == "qlora" else "the frozen base in the compute type")
        trains = units.human_count(sum(la.params for la in adapters))
        count = sum(getattr(la, "parts", 1) for la in adapters)
        assumptions.insert(0, f"{finetune}: rank-{lora_rank} adapters on {count} "
                              f"projections ({trains} parameters train), {base}")
    framework = job.stack or load_stack(stack).with_attention(attention)
    if job.model.family == "transformer" or stack is not None or attention is not None:
        moe = any(isinstance(layer, MoE) for layer in job.model.layers)
        experts = framework.describe_experts() if moe else ""
        assumptions.insert(0, framework.describe() + (f"; {experts}" if experts else ""))
        if moe and framework.name == "megatron":
            # validation, not a correction: see README (training throughput against
            # published LLM runs) and benchmarks/throughput.py
            assumptions.append("known gap: Megatron-Core mixtures of experts run as their "
                               "recipes say measured about 40% slower on H100 than gpusim "
                               "predicts (published runs, benchmarks/throughput.py); the "
                               "cause is not modelled yet, so read this as optimistic")
    fp32_attention = job.precision in ("fp32", "tf32") and any(
        isinstance(layer, Attention) and layer.fused for layer in job.model.layers)
    unmeasured = attention_unmeasured(framework, device, fp32_attention)
    if unmeasured:
        assumptions.insert(0, unmeasured)
    if precision == AUTO_PRECISION:
        assumptions.insert(0, f"{job.precision}: the device's fastest mixed precision "
                              f"(precision auto)")
    if max_batch:
        micro = (job.parallel.microbatch_size if isinstance(job, ParallelJob)
                 else job.microbatch_size)
        assumptions.insert(0, f"microbatch {micro}: the largest that fits and divides the "
                              f"batch (--max-batch)")
    cal = calibration_for(device)
    power = average_power_w(device, cal, step.active_fraction)
    devices = job.topology.num_gpus if isinstance(job, ParallelJob) else 1
    quote = device.cloud_price_usd_per_hour(devices)
    price, price_source = ((quote.usd_per_hour, _quote_source(quote)) if quote
                           else (None, None))
    if usd_per_gpu_hour is not None:
        if not (usd_per_gpu_hour >= 0 and usd_per_gpu_hour < float("inf")):
            raise InvalidConfig(f"a price per GPU-hour must be a finite amount of at least 0, "
                                f"not {usd_per_gpu_hour}")
        price, price_source = usd_per_gpu_hour, "your rate, --usd-per-gpu-hour"
    return TrainingEstimate(
        model=job.model.name,
        device=device.name,
        device_name=device.full_name,
        batch_size=batch_size,
        precision=job.precision,
        step=step,
        steps=n_steps,
        price_usd_per_hour=price,
        price_source=price_source,
        average_power_w=power,
        device_is_gpu=device.is_gpu,
        calibration=f"{cal.name} ({cal.status})",
        assumptions=assumptions,
    )
