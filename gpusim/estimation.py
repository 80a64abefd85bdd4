"""The front door: ``estimate(model=..., gpu=..., ...)`` runs the whole pipeline.

job -> memory plan (OutOfMemory if it does not fit) -> step plan -> simulation -> estimate
of the run (steps, time, cost, energy), with the assumptions it made.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

from gpusim import paths, units
from gpusim.assumptions import (
    OFFLOAD_TEXT,
    attention_unmeasured,
    parallel_assumptions,
    single_assumptions,
)
from gpusim.comm.topology import Topology, system_for_gpu
from gpusim.cost.energy import average_power_w
from gpusim.errors import InvalidConfig
from gpusim.hardware.calibration import Calibration, calibration_for
from gpusim.hardware.catalog import load_device, load_system
from gpusim.hardware.power import with_power_limit
from gpusim.hardware.profile import DeviceProfile, GPUProfile, PriceQuote, SystemProfile
from gpusim.plan.activation_offload import BREAKDOWN_KEY as OFFLOAD_KEY
from gpusim.plan.activation_offload import exposed_seconds, offload_split
from gpusim.plan.job import (
    AUTO_PRECISION,
    DEFAULT_LOADER_WORKERS,
    Checkpointing,
    Optimizer,
    TrainingJob,
    TrainingPrecision,
    auto_precision,
)
from gpusim.plan.lower import lower
from gpusim.plan.memory import MemoryPlan, activations_by_layer, memory_plan
from gpusim.plan.parallel import ParallelPlan, plan_parallel
from gpusim.plan.parallel_job import ParallelConfig, ParallelJob
from gpusim.plan.remedies import check_fits, check_fits_parallel, required_bytes
from gpusim.plan.stage_memory import stage_memory
from gpusim.report import StepResult, TrainingEstimate
from gpusim.sim.engine import simulate
from gpusim.sim.pipeline import simulate_pipeline
from gpusim.sim.ranks import Straggler
from gpusim.stack import Stack, apply_stack, load_stack
from gpusim.workload import formats, zoo
from gpusim.workload.layers import Conv2d, Layer
from gpusim.workload.lora import LORA_SUFFIX, add_lora, parse_targets
from gpusim.workload.model import Model
from gpusim.workload.numerics import Numerics


def resolve_model(model: str | Model, seq_len: int | None = None) -> Model:
    """A Model from a zoo name, a YAML file or Hugging Face config.json path, or a Model
    (returned as is)."""
    if isinstance(model, Model):
        return model
    if model.endswith((".yaml", ".yml", ".json")) or paths.names_a_file(model):
        return formats.load_model_file(model, seq_len)
    return zoo.get(model, seq_len)


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
        memory_breakdown_bytes=worst.breakdown(),
        kernels_per_step=kernels * job.microbatches,
        busy_fraction=sim.busy_fraction,
        active_fraction=plan.active_s_per_step / sim.step_time_s if sim.step_time_s else 0.0,
        trace=sim.trace,
        num_gpus=job.topology.num_gpus,
        parallel=job.parallel.describe(),
    )


def resolve_topology(gpu: str | DeviceProfile | None, system: str | SystemProfile | None,
                     num_gpus: int) -> tuple[Topology, bool]:
    """The cluster for a multi-GPU job: a named system, or one built around the GPU."""
    if system is not None:
        profile = load_system(system) if isinstance(system, str) else system
        topo = Topology.build(profile, num_gpus)
        if gpu is not None:
            device = gpu if isinstance(gpu, DeviceProfile) else load_device(gpu)
            if device.name != topo.gpu.name:
                raise InvalidConfig(f"--gpu {device.name} differs from {profile.name}'s GPU "
                                    f"({topo.gpu.name}); give one of them")
            if isinstance(device, GPUProfile):  # the system's GPU as given (a power limit)
                topo = Topology.build(profile, num_gpus, device)
        return topo, False
    if gpu is None:
        raise InvalidConfig("give --gpu or --system")
    device = gpu if isinstance(gpu, DeviceProfile) else load_device(gpu)
    if not isinstance(device, GPUProfile):
        raise InvalidConfig(f"{device.name} is a CPU; multi-device jobs need GPUs")
    profile, assumed = system_for_gpu(device)
    return Topology.build(profile, num_gpus, device), assumed


def parallel_config(batch_size: int, num_gpus: int, *, tp: int = 1, pp: int = 1,
                    dp: int | None = None, cp: int = 1, ep: int = 1,
                    microbatch_size: int | None = None,
                    grad_accum: int = 1, **options: object) -> ParallelConfig:
    """A ParallelConfig from what a user gives: DP defaults to the GPUs left over by TP x CP
    x PP, the microbatch to the global batch over DP x gradient accumulation."""
    if tp < 1 or pp < 1 or cp < 1:
        raise InvalidConfig(f"--tp, --pp and --cp must be at least 1 (got {tp}, {pp}, {cp})")
    if dp is None:
        if num_gpus % (tp * pp * cp):
            split = f"TP {tp} x " + (f"CP {cp} x " if cp > 1 else "") + f"PP {pp}"
            raise InvalidConfig(f"{num_gpus} GPUs do not split into {split}; pick sizes "
                                f"whose product divides the GPU count")
        dp = num_gpus // (tp * pp * cp)
    if microbatch_size is None:
        if batch_size % (dp * grad_accum):
            raise InvalidConfig(f"global batch {batch_size} does not split over DP {dp} x "
                                f"{grad_accum} microbatches; give --microbatch-size")
        microbatch_size = batch_size // (dp * grad_accum)
    elif grad_accum != 1:
        raise InvalidConfig("give --microbatch-size or --grad-accum, not both (with a "
                            "microbatch size the accumulation follows from the batch)")
    return ParallelConfig(tensor=tp, pipeline=pp, data=dp * cp, context=cp, expert=ep,
                          microbatch_size=microbatch_size, **options)  # type: ignore[arg-type]


def limited_device(gpu: str | DeviceProfile | None, system: str | SystemProfile | None,
                   watts: float) -> DeviceProfile:
    """The job's device (``gpu``, else the system's) under a board power limit of ``watts``."""
    if gpu is None:
        if system is None:
            raise InvalidConfig("give --gpu or --system")
        gpu = (load_system(system) if isinstance(system, str) else system).gpu
    device = gpu if isinstance(gpu, DeviceProfile) else load_device(gpu)
    return with_power_limit(device, watts, calibration_for(device).idle_power_fraction)


Job = TrainingJob | ParallelJob
FINETUNES = ("full", "lora", "qlora")


def build_job(
    model: str | Model,
    gpu: str | DeviceProfile | None,
    batch_size: int,
    *,
    precision: TrainingPrecision | Literal["auto"] = "auto",
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
    microbatch_size: int | None = None,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    pp_layers: tuple[int, ...] = (),
    shard_group: int = 0,
    zero: int = 0,
    sequence_parallel: bool = False,
    tp_overlap: bool = False,
    ep_overlap: bool = False,
    overlap_grad_reduce: bool = True,
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
) -> tuple[Job, bool]:
    """The job ``estimate`` runs (arguments as there), and whether its system was assumed
    (no system profile names the GPU). One device gives a TrainingJob, more a ParallelJob.
    ``max_batch`` replaces the microbatch (and gradient accumulation) by the largest
    microbatch that fits and divides each replica's share of the batch. ``stack`` (a name,
    a YAML file or a Stack; default ``pytorch``) says how the framework writes the layers;
    ``attention`` (auto, flash2, cudnn, efficient, math) replaces its attention kernel;
    ``fp8_recipe`` says how fp8 training scales its tensors (``precision`` fp8);
    ``channels_last`` holds a CNN's tensors channels-last (no transposes around cuDNN's
    tensor-core convolutions); ``power_limit_w`` runs the GPUs under that board power limit
    (nvidia-smi -pl), which lowers their clocks under dense matrix work; ``compile`` runs
    the model under torch.compile (TorchInductor's fused kernels, no per-op Python);
    ``optimizer_in_backward`` steps each parameter as its gradient arrives and
    ``offload_activations`` keeps the saved activations in host memory (both torchtune's,
    one GPU only)."""
    if power_limit_w is not None:
        gpu = limited_device(gpu, system, power_limit_w)
    framework = load_stack(stack).with_attention(attention).with_compile(compile)
    pure_bf16 = pure_bf16 or framework.weights == "bf16"
    net = apply_stack(resolve_model(model, seq_len), framework)
    if channels_last:
        net = replace_layers(net, lambda la: replace(la, channels_last=True)
                             if isinstance(la, Conv2d) else la)
    if finetune not in FINETUNES:
        raise InvalidConfig(f"unknown fine-tuning {finetune!r}; use one of "
                            f"{', '.join(FINETUNES)}")
    quantized = finetune == "qlora"
    if finetune != "full":
        targets = (parse_targets(lora_targets) if isinstance(lora_targets, str)
                   else lora_targets)
        net = add_lora(net, lora_rank, targets, lora_dropout)
    if num_gpus < 1:
        raise InvalidConfig(f"--num-gpus must be at least 1 (got {num_gpus})")
    parallel = (num_gpus > 1 or system is not None or tp > 1 or pp > 1 or (dp or 1) > 1
                or cp > 1 or ep > 1 or microbatch_size is not None)
    if not parallel:
        if gpu is None:
            raise InvalidConfig("give --gpu (or --system with --num-gpus)")
        device = gpu if isinstance(gpu, DeviceProfile) else load_device(gpu)
        job = TrainingJob(net, device, batch_size, _precision(precision, device), grad_accum,
                          optimizer,
                          checkpointing, frozen, loader_workers, pure_bf16=pure_bf16,
                          stack=framework, offload=offload, quantized_base=quantized,
                          adapters_only=finetune != "full", fp8_recipe=fp8_recipe,
                          optimizer_in_backward=optimizer_in_backward,
                          offload_activations=offload_activations)
        if max_batch:
            job = replace(job, grad_accum=batch_size // largest_fitting_divisor(
                batch_size, lambda m: replace(job, grad_accum=batch_size // m)))
        return job, False
    if optimizer_in_backward or offload_activations:
        # As torchtune's single-device recipes run them; with data parallelism the step
        # would wait on each gradient's reduction, which is not modelled.
        named = "--optimizer-in-backward" if optimizer_in_backward else "--offload-activations"
        raise InvalidConfig(f"{named} is modelled on one GPU only; leave out --num-gpus, "
                            f"--system and the parallel flags")
    topo, assumed = resolve_topology(gpu, system, num_gpus)
    config = parallel_config(batch_size, num_gpus, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep,
                             microbatch_size=1 if max_batch else microbatch_size,
                             grad_accum=1 if max_batch else grad_accum,
                             schedule=schedule, virtual_stages=virtual_stages, zero=zero,
                             stage_blocks=tuple(pp_layers), shard_group=shard_group,
                             sequence_parallel=sequence_parallel, tp_overlap=tp_overlap,
                             ep_overlap=ep_overlap,
                             overlap_grad_reduce=overlap_grad_reduce)
    pjob = ParallelJob(net, topo, batch_size, config, _precision(precision, topo.gpu),
                       optimizer, checkpointing,
                       frozen=frozen, loader_workers=loader_workers, pure_bf16=pure_bf16,
                       stack=framework, offload=offload, quantized_base=quantized,
                       adapters_only=finetune != "full", fp8_recipe=fp8_recipe)
    if max_batch:
        share = batch_size * config.context // config.data

        def with_micro(m: int) -> ParallelJob:
            return replace(pjob, parallel=replace(config, microbatch_size=m))

        pjob = with_micro(largest_fitting_divisor(share, with_micro))
    return pjob, assumed


def replace_layers(model: Model, change: Callable[[Layer], Layer]) -> Model:
    """``model`` with each layer replaced by ``change(layer)``."""
    return replace(model, layers=tuple(change(la) for la in model.layers))


def _precision(precision: str, device: DeviceProfile) -> TrainingPrecision:
    """``precision``, with "auto" as the device's fastest mixed precision."""
    return auto_precision(device) if precision == AUTO_PRECISION else precision  # type: ignore[return-value]


def largest_fitting_divisor(total: int, job_for: Callable[[int], Job]) -> int:
    """The largest microbatch dividing ``total`` whose job fits (memory grows with the
    microbatch, so the divisors are tried from the top); 1 when none does, for the caller's
    out-of-memory error to report."""
    divisors = sorted({d for i in range(1, math.isqrt(total) + 1) if total % i == 0
                       for d in (i, total // i)}, reverse=True)
    for m in divisors:
        try:
            job = job_for(m)
        except InvalidConfig:  # e.g. the interleaved schedule's microbatch count
            continue
        if required_bytes(job)[1]:
            return m
    return 1


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
    microbatch_size: int | None = None,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    pp_layers: tuple[int, ...] = (),
    shard_group: int = 0,
    zero: int = 0,
    sequence_parallel: bool = False,
    tp_overlap: bool = False,
    ep_overlap: bool = False,
    overlap_grad_reduce: bool = True,
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
    memory savers (see ``build_job``).
    """
    if steps is None and tokens is None and epochs is None:
        steps = 1
    job, assumed = build_job(
        model, gpu, batch_size, precision=precision, seq_len=seq_len, grad_accum=grad_accum,
        optimizer=optimizer, checkpointing=checkpointing, frozen=frozen,
        loader_workers=loader_workers, num_gpus=num_gpus, system=system, tp=tp, pp=pp, dp=dp,
        cp=cp, ep=ep, microbatch_size=microbatch_size, schedule=schedule,
        virtual_stages=virtual_stages,
        pp_layers=pp_layers, shard_group=shard_group,
        zero=zero, sequence_parallel=sequence_parallel, tp_overlap=tp_overlap,
        ep_overlap=ep_overlap,
        overlap_grad_reduce=overlap_grad_reduce, max_batch=max_batch, pure_bf16=pure_bf16,
        stack=stack, attention=attention, fp8_recipe=fp8_recipe, offload=offload,
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
        assumptions.insert(0, framework.describe())
    unmeasured = attention_unmeasured(framework, device)
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
