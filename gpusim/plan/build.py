"""A training job from what a user gives: the model by name or file, the device or system,
the parallel layout, the software stack and the fine-tuning, checked as they are read.
``build_job`` is what ``estimate`` (gpusim.estimation) runs; search and sweeps call it too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

from gpusim import paths
from gpusim.comm.topology import Topology, system_for_gpu
from gpusim.errors import InvalidConfig
from gpusim.hardware.calibration import calibration_for
from gpusim.hardware.catalog import load_device, load_system
from gpusim.hardware.power import with_power_limit
from gpusim.hardware.profile import DeviceProfile, GPUProfile, SystemProfile
from gpusim.plan.job import (
    AUTO_PRECISION,
    DEFAULT_LOADER_WORKERS,
    Checkpointing,
    Optimizer,
    TrainingJob,
    TrainingPrecision,
    auto_precision,
)
from gpusim.plan.parallel_job import ParallelConfig, ParallelJob
from gpusim.plan.pipeline_layout import layout_blocks
from gpusim.plan.remedies import required_bytes
from gpusim.plan.tensor_parallel import pad_vocab
from gpusim.stack import Stack, apply_stack, load_stack
from gpusim.workload import formats, zoo
from gpusim.workload.layers import Conv2d, Layer
from gpusim.workload.lora import add_lora, parse_targets
from gpusim.workload.model import Model


def resolve_model(model: str | Model, seq_len: int | None = None) -> Model:
    """A Model from a zoo name, a YAML file or Hugging Face config.json path, or a Model
    (returned as is)."""
    if isinstance(model, Model):
        return model
    if model.endswith((".yaml", ".yml", ".json")) or paths.names_a_file(model):
        return formats.load_model_file(model, seq_len)
    return zoo.get(model, seq_len)


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
    one GPU only); ``bf16_grads`` accumulates and reduces gradients in bf16;
    ``bf16_states`` keeps the optimizer's states in bf16."""
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
        if framework.vocab_multiple > 1:  # parallel jobs pad per TP rank as they shard
            net = replace_layers(net, lambda la: pad_vocab(la, framework.vocab_multiple))
        job = TrainingJob(net, device, batch_size, _precision(precision, device), grad_accum,
                          optimizer,
                          checkpointing, frozen, loader_workers, pure_bf16=pure_bf16,
                          # a stack that holds 16-bit weights with fp32 master copies
                          # (Megatron-LM's) does so on one GPU too, as its parallel jobs do
                          master_weights=framework.weights == "master" and not pure_bf16,
                          stack=framework, offload=offload, quantized_base=quantized,
                          adapters_only=finetune != "full", fp8_recipe=fp8_recipe,
                          optimizer_in_backward=optimizer_in_backward,
                          offload_activations=offload_activations, bf16_grads=bf16_grads,
                          bf16_states=bf16_states)
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
    if pp_layout:  # Megatron-LM's layout string, read into blocks per chunk
        if pp_layers:
            raise InvalidConfig("give the pipeline split once: --pp-layers or --pp-layout")
        pp_layers = layout_blocks(pp_layout)
    topo, assumed = resolve_topology(gpu, system, num_gpus)
    config = parallel_config(batch_size, num_gpus, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep,
                             microbatch_size=1 if max_batch else microbatch_size,
                             grad_accum=1 if max_batch else grad_accum,
                             schedule=schedule, virtual_stages=virtual_stages, zero=zero,
                             stage_blocks=tuple(pp_layers), shard_group=shard_group,
                             sequence_parallel=sequence_parallel, tp_overlap=tp_overlap,
                             ep_overlap=ep_overlap, ep_dispatcher=ep_dispatcher,
                             moe_imbalance=moe_imbalance, moe_capacity=moe_capacity,
                             moe_pad=moe_pad, expert_tensor_size=etp,
                             overlap_grad_reduce=overlap_grad_reduce)
    pjob = ParallelJob(net, topo, batch_size, config, _precision(precision, topo.gpu),
                       optimizer, checkpointing,
                       frozen=frozen, loader_workers=loader_workers, pure_bf16=pure_bf16,
                       stack=framework, offload=offload, quantized_base=quantized,
                       adapters_only=finetune != "full", fp8_recipe=fp8_recipe,
                       bf16_grads=bf16_grads, bf16_states=bf16_states)
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
