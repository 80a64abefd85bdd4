"""A training job: model, device, batch, precision and training techniques, checked.

The checks here are about the job itself (a batch that is not positive, an accumulation that
does not divide the batch, a precision the device lacks); each raises a typed error with a
message that says what to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpusim.errors import InvalidConfig, UnsupportedPrecision
from gpusim.hardware.profile import DeviceProfile
from gpusim.plan.offload import check_offload
from gpusim.plan.recompute import parse_recompute
from gpusim.stack import Stack, default_stack
from gpusim.workload.fp8 import FP8_RECIPES
from gpusim.workload.layers import Layer, Linear
from gpusim.workload.lora import LORA_SUFFIX
from gpusim.workload.model import Model
from gpusim.workload.numerics import Numerics

TrainingPrecision = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
TRAINING_PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8")
AUTO_PRECISION = "auto"


def auto_precision(device: DeviceProfile) -> TrainingPrecision:
    """Mixed precision as the device's matrix units take it: bf16, else fp16, else fp32
    (what `--precision auto`, every command's default, picks)."""
    for precision in ("bf16", "fp16"):
        if precision in device.matrix_tflops:
            return precision
    return "fp32"
Optimizer = Literal["adam", "adamw", "sgd", "sgd-momentum", "adamw8bit", "adafactor"]
OPTIMIZERS: tuple[str, ...] = ("adam", "adamw", "sgd", "sgd-momentum", "adamw8bit", "adafactor")
# A recompute mode (gpusim.plan.recompute): none, selective, per-op, full, every-k:N or
# block:N.
Checkpointing = str

# Data-loader worker processes a training process starts unless told otherwise (a common
# DataLoader num_workers in ImageNet recipes; 0 is synthetic data on the device).
DEFAULT_LOADER_WORKERS = 8


# bitsandbytes' NF4 with double quantization: 4 bits a weight, an 8-bit scale per 64
# weights and an fp32 scale per 256 of those (Dettmers et al. 2023, QLoRA, section 3:
# 4.127 bits a parameter).
NF4_BYTES = (4 + 8 / 64 + 32 / (64 * 256)) / 8


def in_prefix(name: str, prefix: str) -> bool:
    """Whether layer ``name`` is ``prefix`` or inside it ("h.1" holds "h.1.mlp", not "h.10";
    a prefix ending in a dot, "h.", holds every name that starts with it)."""
    if prefix.endswith("."):
        return name.startswith(prefix)
    return name == prefix or name.startswith(prefix + ".")


@dataclass(frozen=True)
class TrainingJob:
    """One optimizer step's worth of work on one device.

    ``batch_size`` is the samples per optimizer step; with ``grad_accum`` K it is split into K
    microbatches of ``batch_size / K``. ``frozen`` lists layer-name prefixes whose weights do
    not train. ``loader_workers`` 0 means synthetic data already on the device.
    ``master_weights`` runs it as Megatron-LM does: 16-bit weights with fp32 master copies,
    its fused optimizer and its vocab-parallel cross-entropy. ``fsdp`` runs it as PyTorch
    FSDP's mixed precision does: fp32 weights, each gathered in the compute type before its
    layers run, so every layer computes in that type and autocast casts nothing.
    ``pure_bf16`` holds the whole model in bf16 (torchtune's and LitGPT's "bf16-true"):
    bf16 weights, gradients and optimizer states (PyTorch's optimizers keep their states in
    the parameters' type), no fp32 copy of anything, nothing cast.
    ``optimizer_in_backward`` steps each parameter as soon as its gradient is accumulated and
    frees the gradient (torchtune's ``optimizer_in_bwd``); ``offload_activations`` moves the
    tensors saved for backward to pinned host memory and back (torchtune's
    ``enable_activation_offloading``; gpusim.plan.activation_offload).
    ``bf16_grads`` accumulates and reduces gradients in bf16 (Megatron-LM's
    ``--grad-reduce-in-bf16``, Megatron-Bridge's ``ddp.grad_reduce_in_fp32: false``); see
    ``grad_bytes`` and ``reduce_bytes``.
    ``bf16_states`` keeps the optimizer's states in bf16: Adam's moments and, with master
    weights, its copy of the weights (apex's DistributedFusedAdam with dtype bf16, as NeMo's
    Nemotron-4 340B configuration sets it).
    """

    model: Model
    device: DeviceProfile
    batch_size: int
    precision: TrainingPrecision = "fp32"
    grad_accum: int = 1
    optimizer: Optimizer = "adam"
    checkpointing: Checkpointing = "none"
    frozen: tuple[str, ...] = ()
    loader_workers: int = DEFAULT_LOADER_WORKERS
    master_weights: bool = False
    input_requires_grad: bool = False
    fsdp: bool = False
    pure_bf16: bool = False
    stack: Stack | None = None  # how the framework runs the step (None: the default stack)
    offload: str = "none"  # optimizer or params in host memory (gpusim.plan.offload)
    quantized_base: bool = False  # frozen projections held in 4-bit NF4 (QLoRA)
    adapters_only: bool = False  # LoRA: only the adapters train, the base is frozen
    fp8_recipe: str = "tensorwise"  # with precision fp8: how scales are found (workload/fp8.py)
    optimizer_in_backward: bool = False  # each parameter stepped as its gradient arrives
    offload_activations: bool = False  # saved activations kept in host memory until backward
    bf16_grads: bool = False  # gradients accumulated and reduced in bf16, not fp32
    bf16_states: bool = False  # the optimizer's states (and master copy) in bf16, not fp32
    # Tensor-parallel ranks a stage's layers are split over (a ParallelJob's stage jobs; 1 for
    # one device): with a dtensor stack, whether the loss runs under loss_parallel
    tensor_parallel: int = 1

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise InvalidConfig(f"batch size must be positive (got {self.batch_size})")
        if self.grad_accum <= 0:
            raise InvalidConfig(f"gradient accumulation must be positive (got {self.grad_accum})")
        if self.batch_size % self.grad_accum:
            raise InvalidConfig(
                f"batch size {self.batch_size} is not divisible by gradient accumulation "
                f"{self.grad_accum}; pick a batch that is a multiple of it"
            )
        if self.precision not in TRAINING_PRECISIONS:
            raise InvalidConfig(
                f"unknown precision {self.precision!r}; use one of {', '.join(TRAINING_PRECISIONS)}"
            )
        if self.optimizer not in OPTIMIZERS:
            raise InvalidConfig(
                f"unknown optimizer {self.optimizer!r}; use one of {', '.join(OPTIMIZERS)}"
            )
        if parse_recompute(self.checkpointing) != self.checkpointing:
            object.__setattr__(self, "checkpointing", parse_recompute(self.checkpointing))
        if self.loader_workers < 0:
            raise InvalidConfig(f"loader workers must be 0 or more (got {self.loader_workers})")
        names = [layer.name for layer in self.model.layers]
        for prefix in self.frozen:
            if not any(in_prefix(n, prefix) for n in names):
                raise InvalidConfig(
                    f"--freeze {prefix!r} matches no layer of {self.model.name}; layer names "
                    f"look like {', '.join(names[:3])} (`gpusim models show` lists them)"
                )
        check_offload(self.offload, 3 if self.fsdp else None)
        if self.offload != "none" and not self.device.is_gpu:
            raise InvalidConfig("offload moves state from a GPU to its host; this job runs "
                                "on a CPU already")
        if self.pure_bf16 and self.precision != "bf16":
            who = (f"the {self.framework.name} stack holds the model in bf16 (pure bf16)"
                   if self.framework.weights == "bf16" else
                   "pure bf16 training holds the model in bf16")
            raise InvalidConfig(f"{who}; it needs --precision bf16 (got {self.precision})")
        if self.optimizer == "adafactor" and self.master_weights:
            raise InvalidConfig("Megatron-LM's optimizer (tensor or pipeline parallelism) "
                                "has no Adafactor; use --optimizer adam or adamw there")
        if self.pure_bf16 and self.master_weights:
            raise InvalidConfig("pure bf16 keeps no fp32 master weights, which Megatron-LM "
                                "style training (tensor or pipeline parallelism) keeps")
        if self.bf16_grads and self.precision not in ("bf16", "fp8"):
            raise InvalidConfig(f"--grad-reduce-in-bf16 goes with bf16 or fp8 training, whose "
                                f"gradients are bf16 (got --precision {self.precision})")
        if self.bf16_states and not self.mixed_precision:
            raise InvalidConfig(f"--bf16-optimizer-states goes with 16-bit or fp8 training "
                                f"(got --precision {self.precision})")
        if self.optimizer_in_backward:
            self._check_optimizer_in_backward()
        if self.offload_activations and not self.device.is_gpu:
            raise InvalidConfig("--offload-activations moves saved activations from a GPU to "
                                "its host; this job runs on a CPU already")
        self.numerics()  # raises UnsupportedPrecision early

    def _check_optimizer_in_backward(self) -> None:
        """What stepping in backward cannot be combined with."""
        if self.grad_accum > 1:
            # torchtune refuses it too (recipes/full_finetune_single_device.py, __init__:
            # "Gradient accumulation is not supported with optimizer_in_bwd: True").
            raise InvalidConfig(f"--optimizer-in-backward steps each parameter as soon as its "
                                f"gradient exists, so gradients cannot accumulate over "
                                f"{self.grad_accum} microbatches; use --grad-accum 1 (a "
                                f"microbatch of the whole batch) or leave the flag out")
        if self.offload != "none":
            raise InvalidConfig("--optimizer-in-backward steps on the GPU during backward; "
                                "--offload steps on the CPUs after it: give one of them")
        if self.precision == "fp16":
            # fp16 needs GradScaler, which skips a step when any gradient overflowed
            # (torch/amp/grad_scaler.py, GradScaler.step and its found_inf check): every
            # gradient must exist before any parameter steps. torchtune's recipe refuses
            # fp16 outright (recipes/full_finetune_single_device.py, __init__).
            raise InvalidConfig("--optimizer-in-backward cannot run under fp16's gradient "
                                "scaling, which checks every gradient before stepping; use "
                                "--precision bf16")
        if self.master_weights:
            raise InvalidConfig("--optimizer-in-backward is modelled for PyTorch optimizers, "
                                "not Megatron-LM's (tensor or pipeline parallelism)")

    @property
    def microbatch_size(self) -> int:
        return self.batch_size // self.grad_accum

    @property
    def mixed_precision(self) -> bool:
        return self.precision in ("fp16", "bf16", "fp8")

    @property
    def weight_bytes(self) -> int:
        """Bytes per weight as the model holds it."""
        return 2 if (self.master_weights and self.mixed_precision) or self.pure_bf16 else 4

    @property
    def gathered_weight_bytes(self) -> int:
        """Bytes per weight that ZeRO-3 gathers: FSDP's mixed precision gathers the compute
        type (its param_dtype), everything else the type the weights are held in."""
        return self.numerics().act_bytes if self.fsdp and self.mixed_precision \
            else self.weight_bytes

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element as kept and accumulated: fp32, except that
        Megatron-LM's fp16 training keeps fp16 gradients (it accumulates and all-reduces in
        fp32 only for bf16, where it forces accumulate_allreduce_grads_in_fp32 unless
        --grad-reduce-in-bf16 says otherwise: megatron/training/arguments.py, and its
        gradient buffers take grad_reduce_in_fp32's type, core/distributed/
        param_and_grad_buffer.py). Stacks without such buffers keep gradients in the
        parameters' type, whatever type they reduce in."""
        if self.master_weights and (self.precision == "fp16" or self.bf16_grads):
            return 2
        return 2 if self.pure_bf16 else 4

    @property
    def reduce_bytes(self) -> int:
        """Bytes per gradient element as data parallelism reduces it: the kept type, or
        bf16 where ``bf16_grads`` says so (for FSDP2 its MixedPrecisionPolicy reduce_dtype,
        for DDP a bf16 compression hook; the gradients they keep stay fp32)."""
        return 2 if self.bf16_grads else self.grad_bytes

    @property
    def state_bytes(self) -> int:
        """Bytes per element of the optimizer's states and of its master copy."""
        return 2 if self.bf16_states or self.pure_bf16 else 4

    @property
    def framework(self) -> Stack:
        return self.stack or default_stack()

    @property
    def frozen_weight_bytes(self) -> int:
        """Bytes per frozen weight: under mixed precision fine-tuning loads the weights that
        do not train in the compute type (no master copy, nothing for autocast to cast)."""
        return self.numerics().act_bytes if self.mixed_precision else self.weight_bytes

    def quantized(self, layer: Layer) -> bool:
        """Whether ``layer``'s weight is held in 4 bits: QLoRA quantizes the frozen
        projections of the body, not the embeddings, norms or output head."""
        return (self.quantized_base and isinstance(layer, Linear) and layer.in_body
                and not self.is_trainable(layer.name))

    def frozen_bytes(self, layer: Layer) -> float:
        """Bytes per weight of a frozen ``layer``."""
        return NF4_BYTES if self.quantized(layer) else self.frozen_weight_bytes

    def is_trainable(self, layer_name: str) -> bool:
        if self.adapters_only and not layer_name.endswith(LORA_SUFFIX):
            return False
        return not self.frozen or not any(in_prefix(layer_name, p) for p in self.frozen)

    def trains_weights(self, layer: Layer) -> bool:
        """Whether backward computes ``layer``'s weight gradient: it has weights, its own or
        tied to another layer's (a GPT head tied to the token embedding), and neither it
        nor the layer it is tied to is frozen."""
        tied = getattr(layer, "tied_to", "")
        if not (layer.params or tied):
            return False
        return self.is_trainable(layer.name) and (not tied or self.is_trainable(tied))

    def numerics(self) -> Numerics:
        """Resolve the training precision against the device, as PyTorch would run it."""
        dev = self.device
        gpu = dev.is_gpu
        if self.precision == "fp32":
            # PyTorch lets cuDNN use TF32 for convolutions by default, but not cuBLAS.
            conv = "tf32" if gpu and "tf32" in dev.matrix_tflops else "fp32"
            return Numerics("fp32", conv, "fp32")
        if self.precision == "tf32":
            if "tf32" not in dev.matrix_tflops:
                raise UnsupportedPrecision(
                    f"{dev.full_name} has no TF32 tensor cores (Ampere and later do); use fp32"
                )
            return Numerics("tf32", "tf32", "fp32")
        has_bf16 = "bf16" in dev.matrix_tflops or "bf16" in dev.vector_tflops
        if self.precision == "bf16" and gpu and not has_bf16:
            raise UnsupportedPrecision(
                f"{dev.full_name} has no bf16 arithmetic (it came with Ampere); use fp16"
            )
        if self.precision == "fp8":
            if "fp8" not in dev.matrix_tflops:
                raise UnsupportedPrecision(
                    f"{dev.full_name} has no fp8 tensor cores (Hopper, Ada and later do); "
                    f"use bf16 or fp16"
                )
            if self.fp8_recipe not in FP8_RECIPES:
                raise InvalidConfig(f"unknown fp8 recipe {self.fp8_recipe!r}; use one of "
                                    f"{', '.join(FP8_RECIPES)}")
            return Numerics("fp8", "bf16", "bf16", fp8_recipe=self.fp8_recipe)
        return Numerics(self.precision, self.precision, self.precision)
