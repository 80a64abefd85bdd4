"""The front door: ``estimate(model=..., gpu=..., ...)`` runs the whole pipeline.

job -> memory plan (OutOfMemory if it does not fit) -> step plan -> simulation -> estimate
of the run (steps, time, cost, energy), with the assumptions it made.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gpusim import units
from gpusim.comm.topology import Topology, system_for_gpu
from gpusim.cost.energy import average_power_w
from gpusim.errors import InvalidConfig
from gpusim.hardware.calibration import Calibration, calibration_for
from gpusim.hardware.catalog import load_device, load_system
from gpusim.hardware.profile import DeviceProfile, GPUProfile, SystemProfile
from gpusim.plan.autocast import autocasts
from gpusim.plan.job import (
    DEFAULT_LOADER_WORKERS,
    Checkpointing,
    Optimizer,
    TrainingJob,
    TrainingPrecision,
)
from gpusim.plan.lower import lower
from gpusim.plan.memory import memory_plan
from gpusim.plan.parallel import plan_parallel, stage_memory
from gpusim.plan.parallel_job import ParallelConfig, ParallelJob
from gpusim.plan.remedies import check_fits, check_fits_parallel, required_bytes
from gpusim.report import StepResult, TrainingEstimate
from gpusim.sim.engine import simulate
from gpusim.sim.pipeline import simulate_pipeline
from gpusim.sim.ranks import Straggler, rank_coords
from gpusim.stack import Stack, apply_stack, load_stack
from gpusim.workload import formats, zoo
from gpusim.workload.layers import Conv2d
from gpusim.workload.lora import LORA_SUFFIX, add_lora, parse_targets
from gpusim.workload.model import Model
from gpusim.workload.numerics import Numerics

_ENERGY = ("energy: each device draws idle power, plus (TDP - idle) while a kernel works "
           "its bottleneck unit at the attainable rate (ramps, launch gaps, waits and exposed "
           "communication at idle power); board power only, no host or cooling")


def resolve_model(model: str | Model, seq_len: int | None = None) -> Model:
    """A Model from a zoo name, a YAML file path, or a Model (returned as is)."""
    if isinstance(model, Model):
        return model
    if model.endswith((".yaml", ".yml")) or Path(model).is_file():
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
    return StepResult(
        step_time_s=sim.step_time_s,
        breakdown_s=sim.breakdown_s,
        samples_per_step=job.batch_size,
        tokens_per_sample=job.model.tokens_per_sample,
        model_flops_per_step=plan.model_flops_per_step,
        peak_flops=mfu_peak(job.device, job.model, job.numerics()),
        peak_memory_bytes=mem.peak_bytes,
        peak_reserved_bytes=mem.reserved_bytes,
        memory_breakdown_bytes=mem.breakdown(),
        kernels_per_step=sim.kernels_per_step,
        busy_fraction=sim.busy_s / sim.step_time_s if sim.step_time_s else 0.0,
        active_fraction=plan.active_s_per_step / sim.step_time_s if sim.step_time_s else 0.0,
        trace=sim.trace,
    )


def simulate_parallel_step(job: ParallelJob, calibration: Calibration | None = None, *,
                           trace: bool = True, per_rank: bool = False,
                           straggler: Straggler | None = None,
                           comm_slowdown: float = 0.0) -> StepResult:
    """Simulate one step of a multi-GPU job (raises OutOfMemory if a stage does not fit);
    ``per_rank`` simulates every data-parallel replica, a ``straggler`` slows one rank,
    ``comm_slowdown`` slows kernels while a data-parallel collective runs beside them."""
    plan = plan_parallel(job, calibration)
    mems = [stage_memory(plan, stage) for stage in plan.stages]
    check_fits_parallel(job, mems)
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


def _simulated_ranks(job: ParallelJob, per_rank: bool, straggler: Straggler | None) -> str:
    p = job.parallel
    if not per_rank and straggler is None:
        return "one representative rank per pipeline stage"
    text = (f"every rank: {p.data * p.pipeline} units (data-parallel replicas x stages), each "
            f"a tensor-parallel group of {p.tensor} in lockstep")
    if straggler is not None:
        at = rank_coords(straggler.rank, p.tensor, p.data, p.pipeline)
        slow = [f"kernels x{straggler.compute:g}"] if straggler.compute > 1 else []
        slow += [f"transfers x{straggler.link:g}"] if straggler.link > 1 else []
        text += (f"; straggler rank {straggler.rank} (stage {at.stage}, replica {at.replica}): "
                 f"{', '.join(slow) or 'no slowdown'}")
    return text


def _parallel_assumptions(job: ParallelJob, assumed_system: bool, per_rank: bool = False,
                          straggler: Straggler | None = None,
                          comm_slowdown: float = 0.0) -> list[str]:
    p, topo = job.parallel, job.topology
    num = job.whole.numerics()
    out = [f"{topo.num_gpus} GPUs on {topo.num_nodes} node(s) of {topo.system.full_name}"
           + (" (an assumed design: no system profile names this GPU; give --system)"
              if assumed_system else ""),
           f"{p.describe()}; {job.microbatches} microbatches per pipeline per step"]
    if job.master_weights:
        grads = "fp16" if job.whole.grad_bytes == 2 else "fp32"
        out.append(f"Megatron-LM style: weights in {num.activation} with fp32 master copies; "
                   f"gradients reduced in {grads}")
    elif job.pure_bf16:
        sharding = {0: "replicated (DDP)", 1: "optimizer states sharded (ZeRO-1)",
                    2: "optimizer states and gradients sharded (ZeRO-2)",
                    3: "all sharded, gathered a unit at a time (FSDP)"}[p.zero]
        out.append(f"pure bf16: weights, gradients and optimizer states in bf16, no fp32 "
                   f"copies; {sharding}")
    elif job.fsdp and job.whole.mixed_precision:
        out.append(f"PyTorch FSDP (full sharding) with mixed precision: fp32 weight, gradient "
                   f"and optimizer shards; each unit's weights gathered in {num.activation} "
                   f"(the running unit and the prefetched next), so every layer computes in "
                   f"{num.activation}; gradients reduce-scattered in fp32")
    elif job.fsdp:
        out.append("PyTorch FSDP (full sharding) in fp32: weights gathered a unit at a time, "
                   "gradients reduce-scattered")
    else:
        sharded = {1: " and a sharded optimizer (ZeRO-1)",
                   2: ", sharded optimizer states and gradients (ZeRO-2)"}.get(p.zero, "")
        out.append(f"PyTorch DDP with autocast{sharded}: matrix products in {num.matmul}, "
                   "fp32 weights and gradients")
    if job.frozen:
        trains = job.trainable_params(job.model.layers)
        total = job.model.parameters
        out.append(f"frozen: {', '.join(job.frozen)}; {units.human_count(trains)} of "
                   f"{units.human_count(total)} parameters train, and only their gradients "
                   "are computed, reduced and stepped")
    if p.data > 1 and p.zero <= 1:
        out.append("data-parallel gradients reduced in 25 MiB buckets during the last backward "
                   "pass" if p.overlap_grad_reduce else
                   "data-parallel gradients reduced in one buffer after the last backward pass")
    tp_overlap = ("; the backward pass's input gather and gradient reduce-scatter hide behind "
                  "their layer's GEMMs" if p.sequence_parallel else " (no overlap with compute)")
    out.append(f"tensor-parallel collectives on the critical path{tp_overlap}; collectives "
               "take the fastest NCCL algorithm for their size")
    slowdown = (f"kernels {100 * comm_slowdown:g}% slower while a data-parallel collective "
                "runs beside them" if comm_slowdown else
                "no compute slowdown from communication kernels (--comm-slowdown)")
    node_links = ("tensor- and data-parallel traffic share a GPU's links inside a "
                  "node" if job.topology.peers_share_links else
                  "tensor- and data-parallel peers have links of their own (mesh)")
    out.append(f"{_simulated_ranks(job, per_rank, straggler)}; pipeline transfers and "
               f"data-parallel collectives share a GPU's NIC when both leave the node; "
               f"{node_links}; {slowdown}")
    out.append(_parallel_input(job))
    out.append(_ENERGY)
    return out


def _parallel_input(job: ParallelJob) -> str:
    if not job.loader_workers:
        return "input: synthetic data already on the device (no loader, no copy)"
    inp = job.model.input
    cores = job.host_cores_per_replica
    share = ("the node's CPU cores unknown (no CPU in the system profile), so workers are "
             "not capped" if cores is None else
             f"{cores} of the node's CPU cores per replica cap the workers that help")
    return (f"input: {inp.description}; {job.loader_workers} loader workers per data-parallel "
            f"replica at {inp.loader_cpu_s * 1e3:.3g} ms CPU per sample, running on through "
            f"the step; {share}; host-to-device copies not modelled")


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
        return topo, False
    if gpu is None:
        raise InvalidConfig("give --gpu or --system")
    device = gpu if isinstance(gpu, DeviceProfile) else load_device(gpu)
    if not isinstance(device, GPUProfile):
        raise InvalidConfig(f"{device.name} is a CPU; multi-device jobs need GPUs")
    profile, assumed = system_for_gpu(device)
    return Topology.build(profile, num_gpus, device), assumed


def _assumptions(job: TrainingJob) -> list[str]:
    num = job.numerics()
    held = "bf16 (pure bf16: no fp32 copies)" if job.pure_bf16 else "fp32"
    out = [f"matrix products in {num.matmul}, convolutions in {num.conv}, activations in "
           f"{num.activation}; weights, gradients and optimizer states in {held}"]
    if job.frozen and job.mixed_precision:
        out.append(f"frozen weights held in {num.activation} (as fine-tuning loads them)")
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
    if job.device.is_gpu and any(isinstance(la, Conv2d) for la in job.model.layers):
        out.append("tensors in PyTorch's default NCHW layout: cuDNN transposes them for its "
                   "tensor-core convolutions (channels-last training skips that)")
    if autocasts(job):
        out.append("autocast: norms, softmax and a transformer's residual stream stay fp32; "
                   "each fp32 weight is cast once per forward")
    out.append(_ENERGY)
    return out


def parallel_config(batch_size: int, num_gpus: int, *, tp: int = 1, pp: int = 1,
                    dp: int | None = None, microbatch_size: int | None = None,
                    grad_accum: int = 1, **options: object) -> ParallelConfig:
    """A ParallelConfig from what a user gives: DP defaults to the GPUs left over by TP x PP,
    the microbatch to the global batch over DP x gradient accumulation."""
    if tp < 1 or pp < 1:
        raise InvalidConfig(f"--tp and --pp must be at least 1 (got {tp}, {pp})")
    if dp is None:
        if num_gpus % (tp * pp):
            raise InvalidConfig(f"{num_gpus} GPUs do not split into TP {tp} x PP {pp}; pick "
                                f"sizes whose product divides the GPU count")
        dp = num_gpus // (tp * pp)
    if microbatch_size is None:
        if batch_size % (dp * grad_accum):
            raise InvalidConfig(f"global batch {batch_size} does not split over DP {dp} x "
                                f"{grad_accum} microbatches; give --microbatch-size")
        microbatch_size = batch_size // (dp * grad_accum)
    elif grad_accum != 1:
        raise InvalidConfig("give --microbatch-size or --grad-accum, not both (with a "
                            "microbatch size the accumulation follows from the batch)")
    return ParallelConfig(tensor=tp, pipeline=pp, data=dp, microbatch_size=microbatch_size,
                          **options)  # type: ignore[arg-type]


Job = TrainingJob | ParallelJob
FINETUNES = ("full", "lora", "qlora")
OFFLOAD_TEXT = {
    "optimizer": "optimizer offloaded (ZeRO-Offload): master weights and Adam states in host "
                 "memory; each step the gradients go down PCIe, the CPUs step, the weights "
                 "come back, in turn after the backward pass",
    "params": "FSDP CPU offload: weight, gradient and optimizer shards in host memory; the "
              "CPUs step; gradients down and weights up over PCIe after the backward pass",
}


def build_job(
    model: str | Model,
    gpu: str | DeviceProfile | None,
    batch_size: int,
    *,
    precision: TrainingPrecision = "fp32",
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
    microbatch_size: int | None = None,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    zero: int = 0,
    sequence_parallel: bool = False,
    overlap_grad_reduce: bool = True,
    max_batch: bool = False,
    pure_bf16: bool = False,
    stack: str | Stack | None = None,
    offload: str = "none",
    finetune: str = "full",
    lora_rank: int = 8,
    lora_targets: str | tuple[str, ...] = ("q", "v"),
    lora_dropout: bool = False,
) -> tuple[Job, bool]:
    """The job ``estimate`` runs (arguments as there), and whether its system was assumed
    (no system profile names the GPU). One device gives a TrainingJob, more a ParallelJob.
    ``max_batch`` replaces the microbatch (and gradient accumulation) by the largest
    microbatch that fits and divides each replica's share of the batch. ``stack`` (a name,
    a YAML file or a Stack; default ``pytorch``) says how the framework writes the layers."""
    framework = load_stack(stack)
    net = apply_stack(resolve_model(model, seq_len), framework)
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
                or microbatch_size is not None)
    if not parallel:
        if gpu is None:
            raise InvalidConfig("give --gpu (or --system with --num-gpus)")
        device = gpu if isinstance(gpu, DeviceProfile) else load_device(gpu)
        job = TrainingJob(net, device, batch_size, precision, grad_accum, optimizer,
                          checkpointing, frozen, loader_workers, pure_bf16=pure_bf16,
                          stack=framework, offload=offload, quantized_base=quantized,
                          adapters_only=finetune != "full")
        if max_batch:
            job = replace(job, grad_accum=batch_size // largest_fitting_divisor(
                batch_size, lambda m: replace(job, grad_accum=batch_size // m)))
        return job, False
    topo, assumed = resolve_topology(gpu, system, num_gpus)
    config = parallel_config(batch_size, num_gpus, tp=tp, pp=pp, dp=dp,
                             microbatch_size=1 if max_batch else microbatch_size,
                             grad_accum=1 if max_batch else grad_accum,
                             schedule=schedule, virtual_stages=virtual_stages, zero=zero,
                             sequence_parallel=sequence_parallel,
                             overlap_grad_reduce=overlap_grad_reduce)
    pjob = ParallelJob(net, topo, batch_size, config, precision, optimizer, checkpointing,
                       frozen=frozen, loader_workers=loader_workers, pure_bf16=pure_bf16,
                       stack=framework, offload=offload, quantized_base=quantized,
                       adapters_only=finetune != "full")
    if max_batch:
        share = batch_size // config.data

        def with_micro(m: int) -> ParallelJob:
            return replace(pjob, parallel=replace(config, microbatch_size=m))

        pjob = with_micro(largest_fitting_divisor(share, with_micro))
    return pjob, assumed


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


def estimate(
    model: str | Model,
    gpu: str | DeviceProfile | None,
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
    loader_workers: int = DEFAULT_LOADER_WORKERS,
    num_gpus: int = 1,
    system: str | SystemProfile | None = None,
    tp: int = 1,
    pp: int = 1,
    dp: int | None = None,
    microbatch_size: int | None = None,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    zero: int = 0,
    sequence_parallel: bool = False,
    overlap_grad_reduce: bool = True,
    per_rank: bool = False,
    straggler: Straggler | None = None,
    comm_slowdown: float = 0.0,
    max_batch: bool = False,
    pure_bf16: bool = False,
    stack: str | Stack | None = None,
    offload: str = "none",
    finetune: str = "full",
    lora_rank: int = 8,
    lora_targets: str | tuple[str, ...] = ("q", "v"),
    lora_dropout: bool = False,
) -> TrainingEstimate:
    """Predict a training run of ``model`` on one ``gpu`` (a GPU or CPU profile), or on
    ``num_gpus`` GPUs of a ``system`` split by ``tp`` x ``pp`` x ``dp`` (see ParallelConfig).

    ``batch_size`` is the global batch per optimizer step. The run's length comes from
    exactly one of ``steps``, ``tokens`` (language models) or ``epochs`` with
    ``dataset_size``; with none, one step is estimated. ``per_rank`` and ``straggler`` (one
    slow GPU or link) and ``comm_slowdown`` apply to multi-GPU jobs. ``max_batch`` runs
    the largest microbatch that fits and divides the batch (see ``build_job``).
    """
    if steps is None and tokens is None and epochs is None:
        steps = 1
    job, assumed = build_job(
        model, gpu, batch_size, precision=precision, seq_len=seq_len, grad_accum=grad_accum,
        optimizer=optimizer, checkpointing=checkpointing, frozen=frozen,
        loader_workers=loader_workers, num_gpus=num_gpus, system=system, tp=tp, pp=pp, dp=dp,
        microbatch_size=microbatch_size, schedule=schedule, virtual_stages=virtual_stages,
        zero=zero, sequence_parallel=sequence_parallel,
        overlap_grad_reduce=overlap_grad_reduce, max_batch=max_batch, pure_bf16=pure_bf16,
        stack=stack, offload=offload, finetune=finetune, lora_rank=lora_rank,
        lora_targets=lora_targets, lora_dropout=lora_dropout)
    n_steps = training_steps(job.model, batch_size, epochs=epochs, dataset_size=dataset_size,
                             tokens=tokens, steps=steps)
    if isinstance(job, ParallelJob):
        step = simulate_parallel_step(job, per_rank=per_rank, straggler=straggler,
                                      comm_slowdown=comm_slowdown)
        device: DeviceProfile = job.topology.gpu
        assumptions = _parallel_assumptions(job, assumed, per_rank, straggler, comm_slowdown)
    else:
        if per_rank or straggler is not None or comm_slowdown:
            raise InvalidConfig("--per-rank, --straggler, --slow-link and --comm-slowdown "
                                "apply to multi-GPU jobs (give --num-gpus)")
        device = job.device
        step = simulate_step(job)
        assumptions = _assumptions(job)
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
    if job.model.family == "transformer" or stack is not None:
        assumptions.insert(0, (job.stack or load_stack(stack)).describe())
    if max_batch:
        micro = (job.parallel.microbatch_size if isinstance(job, ParallelJob)
                 else job.microbatch_size)
        assumptions.insert(0, f"microbatch {micro}: the largest that fits and divides the "
                              f"batch (--max-batch)")
    cal = calibration_for(device)
    power = average_power_w(device, cal, step.active_fraction)
    quote = device.cloud_price_usd_per_hour()
    return TrainingEstimate(
        model=job.model.name,
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
        assumptions=assumptions,
    )
