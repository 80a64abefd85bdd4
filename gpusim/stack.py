"""Software stacks: how a framework writes a model's layers, which decides what they keep for
backward and which kernels they run.

Stacks are data, like hardware: one YAML file per stack under ``stacks/`` at the top of the
repository, every choice with its source in the framework's code. ``--stack NAME`` (or a
YAML file) applies one; the default, ``pytorch``, is the model written with current PyTorch's
own modules, as the project's measurement runner writes it. Issue 15 grows the list of
choices (attention kernel, optimizer, fusion, compile); these are the ones memory needs.
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpusim.data import data_dir
from gpusim.errors import InvalidConfig, UnknownName
from gpusim.hardware.catalog import format_validation_error, read_yaml
from gpusim.workload.attention import Attention, CrossEntropy
from gpusim.workload.layers import Elementwise, Layer
from gpusim.workload.model import Model
from gpusim.workload.moe import HostSync, MoE
from gpusim.workload.rotary import RopeImplementation

DEFAULT_STACK = "pytorch"
# Fused kernels that write their output as (batch, seq, heads, dim), so the output
# projection reads it through a view: FlashAttention (flash_fwd allocates out like q in that
# order), the memory-efficient kernel (BMHK), FlashAttention-3 and the Triton kernel.
# SDPA's cuDNN backend (the H100 default, "auto" there) ran with a copy in our profiles.
BSHD_OUTPUT_KERNELS = ("flash2", "flash3", "efficient", "triton")
AttentionKernel = Literal["auto", "flash2", "cudnn", "efficient", "triton", "math"]
ATTENTION_KERNELS: tuple[str, ...] = get_args(AttentionKernel)
CHOICES = ("rms_norm", "kv_heads", "swiglu", "loss", "zero_grad", "optimizer", "attention",
           "weights", "fp8_saved_input", "rope")


class Stack(BaseModel):
    """The implementation choices of one framework; ``sources`` names, for each choice, where
    in the framework's code it is made."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    full_name: str
    description: str = ""
    # upcast: x.float(), normalize, cast back, times the weight, as separate ops;
    # upcast_fp32_weight: the same with the weight multiplied in fp32 before the cast back
    rms_norm: Literal["fused", "upcast", "upcast_fp32_weight"] = "fused"
    # expanded: grouped K and V copied out to every query head before attention
    kv_heads: Literal["native", "expanded"] = "native"
    # unfused: F.silu(a) * b as two ops; fused: one kernel that keeps its inputs only
    swiglu: Literal["unfused", "fused"] = "unfused"
    # upcast: logits cast to fp32 before cross-entropy (fp32 log-probabilities kept);
    # native: cross-entropy on the 16-bit logits; fused: one kernel each way that keeps the
    # 16-bit logits and writes their gradient in their type (flash-attn's xentropy)
    loss: Literal["upcast", "native", "fused"] = "upcast"
    # cross-entropy a chunk at a time: this many chunks, or chunks of this many tokens
    loss_chunks: int = Field(1, ge=1)
    loss_chunk_tokens: int = Field(0, ge=0)
    # to_none: zero_grad() frees the gradients each step (PyTorch 2's default); zeros:
    # they stay allocated, zeroed (PyTorch 1's default, or a framework's own buffers)
    zero_grad: Literal["to_none", "zeros"] = "to_none"
    # the optimizer's implementation: foreach (torch.optim's default on GPUs) computes over
    # all parameters at once and allocates a temporary of their size; fused and per_tensor
    # (a Python loop over parameters) allocate nothing of that size
    optimizer: Literal["foreach", "fused", "per_tensor", "bert_adam"] = "foreach"
    # whether the host reads a value from the device before the optimizer step (a gradient
    # norm or an overflow flag through .item()): the device drains its queue, and the step's
    # dispatch no longer overlaps the backward pass's kernels. Cited in ``sources`` where set.
    sync_before_step: bool = False
    # the attention kernel: auto (SDPA picks it on the device, as the calibration's default
    # fused kernel describes), a named fused kernel, or math (matmul, softmax, matmul: the
    # seq x seq scores in memory)
    attention: Literal[AttentionKernel] = "auto"
    # how the output projection reads the attention kernel's output: None as the kernel
    # writes it (a view after FlashAttention-style kernels, a copy after SDPA's cuDNN
    # backend or unfused attention); view where the framework's attention always hands
    # over its (seq, batch, heads x dim) output as it is (Transformer Engine)
    heads_merge: Literal["view"] | None = None
    # how the model is held when it computes in 16 bits: autocast over fp32 weights
    # (PyTorch's AMP; FSDP's mixed precision gathers 16-bit copies of fp32 shards), 16-bit
    # weights with fp32 master copies in the optimizer (Megatron-LM's --bf16), or bf16
    # through and through, states included (--pure-bf16, which this choice implies)
    weights: Literal["autocast", "master", "bf16"] = "autocast"
    # under fp8 training, what a converted linear layer keeps of its input for the weight
    # gradient: the 16-bit input, cast again in backward (torchao's float8), or its fp8
    # copy, one byte an element (Transformer Engine)
    fp8_saved_input: Literal["high", "fp8"] = "high"
    # under fp8 training, whether a mixture of experts' expert products run in fp8 too
    # (Transformer Engine's GroupedLinear under fp8_autocast) or stay in 16 bits (torchao's
    # float8 converts nn.Linear modules, and grouped experts are none). Cited in ``sources``
    # where set.
    fp8_experts: bool = False
    # the model run under torch.compile (a run's setting, not the framework's: --compile):
    # TorchInductor fuses the memory-bound ops between matrix products into generated kernels
    compiled: bool = False
    # under torch.compile, whether the framework compiles its loss too (torchtune does;
    # torchtitan kept it eager): its kernels are then generated ones, launched from a graph
    compile_loss: bool = False
    # how the framework splits layers over tensor-parallel ranks (gpusim.plan.tensor_parallel):
    # megatron: Megatron-LM's layers, whose column-parallel linear keeps its sequence shard of
    # the input under sequence parallelism and gathers it again in backward, with its
    # vocabulary-parallel cross-entropy turning the kept softmax into the gradient in place;
    # dtensor: PyTorch's parallel styles (torch.distributed.tensor.parallel), where the input
    # is gathered once before the module and autograd keeps the gathered tensor for the
    # weight gradient, with loss_parallel's cross-entropy. Cited in ``sources`` where set.
    tensor_parallel: Literal["megatron", "dtensor"] = "megatron"
    # how PyTorch FSDP (ZeRO-3) holds a unit's gathered weights: per_parameter (FSDP2,
    # fully_shard): the all-gather's output is copied out into each parameter's own storage
    # (split_with_sizes_copy) on the compute stream, every gather; flat (FSDP1's
    # FlatParameter): the layers' weights are views into the gathered buffer, nothing is
    # copied. A source is cited where a stack sets it.
    fsdp: Literal["per_parameter", "flat"] = "per_parameter"
    # the multiple the framework pads the vocabulary to, per tensor-parallel rank: Megatron-LM
    # pads it to make_vocab_size_divisible_by (128) x TP with dummy tokens, so that the
    # embedding and the logits' product have aligned shards; 1: as the tokenizer has it
    vocab_multiple: int = Field(1, ge=1)
    # how a mixture of experts' products run: 0, one grouped kernel per product over all
    # local experts (torch._grouped_mm); N, one cuBLAS GEMM per expert, round-robin on N
    # streams, with each operand cast expert by expert likewise (Transformer Engine's
    # GroupedLinear). Cited in ``sources`` where set.
    expert_streams: int = Field(0, ge=0)
    # when the host reads an MoE layer's tokens per expert back before dispatching them
    # (split sizes it needs as numbers), waiting for the device: never, with_ep (for the
    # all-to-all's splits), always. Cited in ``sources`` where set.
    moe_host_sync: HostSync = "never"
    # whether a plain all-to-all dispatch sends each token copy's routing weight in an
    # all-to-all of its own (forward and backward) rather than applying it where the copy
    # came from. Cited in ``sources`` where set.
    moe_dispatch_probs: bool = False
    # how the model's rotary position embeddings are applied to queries and keys
    # (gpusim.workload.rotary.ROPE_IMPLEMENTATIONS): one fused kernel each way, the
    # complex product in fp32 of Meta's Llama, Hugging Face's rotate_half in 16 bits, or
    # torchtune's fp32 real pairs; under torch.compile one generated kernel whatever the
    # code. Cited in ``sources``.
    rope: RopeImplementation = "rotate_half"
    sources: dict[str, str]

    @model_validator(mode="after")
    def _every_choice_has_a_source(self) -> Stack:
        missing = [c for c in CHOICES if c not in self.sources]
        if self.tensor_parallel != "megatron" and "tensor_parallel" not in self.sources:
            missing.append("tensor_parallel")
        if self.fsdp != "per_parameter" and "fsdp" not in self.sources:
            missing.append("fsdp")
        if self.vocab_multiple != 1 and "vocab_multiple" not in self.sources:
            missing.append("vocab_multiple")
        if self.sync_before_step and "sync_before_step" not in self.sources:
            missing.append("sync_before_step")
        if self.fp8_experts and "fp8_experts" not in self.sources:
            missing.append("fp8_experts")
        for field, default in (("expert_streams", 0), ("moe_host_sync", "never"),
                               ("moe_dispatch_probs", False)):
            if getattr(self, field) != default and field not in self.sources:
                missing.append(field)
        if missing:
            raise ValueError(f"sources must cite where each choice comes from; missing "
                             f"{', '.join(missing)}")
        return self

    def with_attention(self, kernel: str | None) -> Stack:
        """This stack with its attention kernel replaced (``None``: as it is)."""
        if kernel is None or kernel == self.attention:
            return self
        if kernel not in ATTENTION_KERNELS:
            raise InvalidConfig(f"unknown attention kernel {kernel!r}; use one of "
                                f"{', '.join(ATTENTION_KERNELS)}")
        return self.model_copy(update={"attention": kernel})

    def with_compile(self, compiled: bool) -> Stack:
        """This stack run under torch.compile (``compiled``) or eagerly."""
        return self if compiled == self.compiled else self.model_copy(
            update={"compiled": compiled})

    def describe_experts(self) -> str:
        """How the stack runs a mixture of experts' products and token counts ('' for the
        default: one grouped kernel per product, no host wait)."""
        parts = []
        if self.expert_streams:
            parts.append(f"the experts' products one cuBLAS GEMM per expert, "
                         f"{self.expert_streams} streams at a time, each operand cast per "
                         f"expert")
        if self.moe_host_sync != "never":
            when = "" if self.moe_host_sync == "always" else " under expert parallelism"
            parts.append(f"the host waiting for each MoE layer's tokens per expert{when}")
        if self.moe_dispatch_probs:
            parts.append("the routing weights sent in an all-to-all of their own")
        return "; ".join(parts)

    def describe(self) -> str:
        attention = ("attention as SDPA picks it" if self.attention == "auto"
                     else "unfused (math) attention" if self.attention == "math"
                     else f"{self.attention} attention")
        loss = {"upcast": "loss on fp32 logits", "native": "loss on 16-bit logits",
                "fused": "fused cross-entropy on 16-bit logits"}[self.loss]
        optimizer = ("BertAdam (a loop over parameters, each clipped by its own norm)"
                     if self.optimizer == "bert_adam"
                     else f"{self.optimizer.replace('_', '-')} optimizer")
        rest = (f"gradients {'freed' if self.zero_grad == 'to_none' else 'kept'} between "
                f"steps, {optimizer}"
                + (", the host waiting for a gradient norm before it" if self.sync_before_step
                   else "")
                + (f", the vocabulary padded to a multiple of {self.vocab_multiple} per "
                   f"tensor-parallel rank" if self.vocab_multiple > 1 else ""))
        if self.compiled:
            outside = "the head eager, the loss compiled" if self.compile_loss else \
                "the head and loss eager"
            return (f"{self.full_name} stack under torch.compile: {attention}; each block's "
                    f"norms and activations as single TorchInductor kernels, its casts "
                    f"folded into their producers, {outside} ({loss}), {rest}")
        rope = {"fused": "rotary embedding fused", "complex": "rotary embedding as an fp32 "
                "complex product", "rotate_half": "rotary embedding as rotate_half",
                "real_pairs": "rotary embedding on fp32 real pairs"}[self.rope]
        return (f"{self.full_name} stack: {attention}, "
                f"RMS norm {self.rms_norm.replace('_', ' ')}, "
                f"grouped K/V {self.kv_heads}, SwiGLU {self.swiglu}, {rope}, {loss}, {rest}")


def stacks_dir() -> Path:
    """Where the shipped stacks live; ``GPUSIM_STACKS_DIR`` overrides it."""
    override = os.environ.get("GPUSIM_STACKS_DIR")
    if override:
        return Path(override)
    return data_dir("stacks")


def stack_names() -> list[str]:
    return sorted(p.stem for p in stacks_dir().glob("*.yaml"))


@functools.cache
def default_stack() -> Stack:
    return _read(stacks_dir() / f"{DEFAULT_STACK}.yaml")


def load_stack(name: str | Stack | None = None) -> Stack:
    """A stack by name (``stacks/<name>.yaml``) or from a YAML file path."""
    if isinstance(name, Stack):
        return name
    if name is None or name == DEFAULT_STACK:
        return default_stack()
    path = Path(name)
    if path.suffix not in (".yaml", ".yml"):
        path = stacks_dir() / f"{name}.yaml"
        if not path.is_file():
            raise UnknownName(f"unknown stack {name!r}; known: {', '.join(stack_names())} "
                              f"(or give a stack YAML file)")
    elif not path.is_file():
        raise InvalidConfig(f"stack file {name} does not exist")
    return _read(path)


def _read(path: Path) -> Stack:
    try:
        return Stack(**read_yaml(path))
    except ValidationError as exc:
        raise InvalidConfig(format_validation_error(str(path), exc)) from exc


def runs_compiled(layer: Layer, stack: Stack) -> bool:
    """Whether ``layer`` runs inside a compiled graph: a block's layer under --compile, and
    the loss where the framework compiles it too."""
    return stack.compiled and (layer.in_body or (
        stack.compile_loss and isinstance(layer, CrossEntropy)))


def _compiled(layer: Layer) -> Layer:
    """A block's layer as TorchInductor runs it: the ops a norm is written as (an upcast,
    its statistics, the scaling, the cast back) become one generated kernel that reads its
    input and writes its output once; an activation of two inputs keeps only those. Layers
    outside the blocks (embedding, final norm, head) stay eager: frameworks compile each
    block (torchtitan's apply_compile), and the loss where they compile it."""
    if isinstance(layer, Elementwise) and layer.op == "rms_norm":
        return replace(layer, upcast="")
    return layer


def apply_stack(model: Model, stack: Stack) -> Model:
    """``model`` as ``stack`` writes its layers."""
    layers = tuple(_layer(la, stack) for la in model.layers)
    return replace(model, layers=layers)


# A stack's rms_norm choice as an Elementwise norm's ``upcast``.
NORM_UPCAST = {"fused": "", "upcast": "cast_back", "upcast_fp32_weight": "fp32_weight"}


def _layer(layer: Layer, stack: Stack) -> Layer:
    compiled = runs_compiled(layer, stack)
    if compiled:
        layer = _compiled(layer)
    if isinstance(layer, Elementwise) and layer.op == "rms_norm" and not compiled:
        return replace(layer, upcast=NORM_UPCAST[stack.rms_norm])
    if isinstance(layer, CrossEntropy):
        # A compiled loss is one generated kernel each way: TorchInductor fuses the upcast,
        # log-softmax and likelihood, keeps the logits as the loss received them with a
        # log-sum-exp a row, and writes their gradient in their type.
        return replace(layer, upcast=stack.loss == "upcast",
                       fused=stack.loss == "fused" or compiled,
                       chunks=stack.loss_chunks, chunk_rows=stack.loss_chunk_tokens)
    if isinstance(layer, Elementwise) and layer.op == "swiglu":
        # a fused SwiGLU is one kernel each way, costed at the rate measured for
        # TorchInductor's silu*mul (what Megatron-LM's is; Transformer Engine's own fused
        # kernel taken alike)
        fused = stack.swiglu == "fused"
        return replace(layer, saves=2 if fused or compiled else 3, generated=fused)
    if isinstance(layer, MoE):
        return replace(layer, expert_streams=stack.expert_streams,
                       host_sync=stack.moe_host_sync,
                       dispatches_probs=stack.moe_dispatch_probs)
    if isinstance(layer, Attention):
        # the QK norms are the stack's RMS norms; TorchInductor fuses each of them, and the
        # rotary embedding's chain, into one generated kernel each way
        layer = replace(layer, expand_kv=stack.kv_heads == "expanded",
                        rope="fused" if compiled else stack.rope,
                        qk_norm_upcast="" if compiled else NORM_UPCAST[stack.rms_norm])
        if stack.attention == "math":
            return replace(layer, fused=False, kernel="", merge_copy=True)
        if stack.attention != "auto":
            layer = replace(layer, fused=True, kernel=stack.attention)
        view = layer.fused and (stack.heads_merge == "view"
                                or layer.kernel in BSHD_OUTPUT_KERNELS)
        return replace(layer, merge_copy=not view)
    return layer
