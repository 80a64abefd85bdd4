"""Layers: parameters, saved activations, and the ops of forward and backward.

Every layer knows its per-sample shapes, fixed when the model is built, so ``forward(n, num)``
needs only the batch ``n`` and the numerics. The backward pass splits into the input
gradient (needed unless every layer below is frozen) and the weight gradient (skipped for
frozen layers).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Literal

from gpusim.workload.fp8 import quantize_ops
from gpusim.workload.numerics import Numerics
from gpusim.workload.ops import (
    DTYPE_BYTES,
    TENSOR_CORE_MATH,
    GemmShape,
    Op,
    gemm_op,
    memory_op,
)

# How Megatron-style tensor parallelism splits a layer over the ranks of a tensor group:
# "replicated" layers run whole on every rank; "sequence" layers (norms, dropout, residual
# adds over the hidden states) run whole, or on 1/t of the tokens under sequence parallelism;
# "column" matrix products split their outputs and "row" ones their inputs (an all-reduce
# follows a row-parallel layer); "sharded" layers sit between the two and split evenly
# (attention by heads, the MLP activation); "vocab" layers split the vocabulary (embedding,
# output projection, cross-entropy).
TensorSplit = Literal["replicated", "sequence", "column", "row", "sharded", "vocab"]


@dataclass(frozen=True)
class Layer(ABC):
    """A named layer. ``block`` groups layers for activation checkpointing (e.g. ``h.3``);
    ``tp`` says how tensor parallelism splits it."""

    name: str
    block: str = field(default="", kw_only=True)
    tp: TensorSplit = field(default="replicated", kw_only=True)

    @property
    def params(self) -> int:
        return 0

    @property
    def in_body(self) -> bool:
        """Whether the layer sits in one of the model's repeated blocks (``h.3``), not in
        its embedding or head groups nor outside any block."""
        return bool(self.block) and not self.block.startswith(("embed", "head"))

    @property
    def active_params(self) -> int:
        """Parameters one token computes with (all of them but a mixture's unchosen
        experts)."""
        return self.params

    @property
    def out_elements(self) -> int:
        """Output elements per sample (0 for a layer whose output is a scalar loss)."""
        return 0

    @abstractmethod
    def forward(self, n: int, num: Numerics) -> list[Op]:
        """Ops of the forward pass for a batch of ``n`` samples."""

    @abstractmethod
    def backward_input(self, n: int, num: Numerics) -> list[Op]:
        """Ops computing the gradient with respect to the layer's input."""

    def backward_weight(self, n: int, num: Numerics) -> list[Op]:
        """Ops computing the gradient with respect to the layer's parameters."""
        return []

    def tensor_sizes(self) -> list[int]:
        """Elements of each trainable tensor (an optimizer updates them one by one)."""
        return [self.params] if self.params else []

    def factored_sizes(self) -> list[int]:
        """Elements of each trainable tensor's factored second moment, as Adafactor keeps
        it: a matrix's row and column means (its sum over the last dimension, and over the
        one before), a vector whole."""
        return self.tensor_sizes()

    def saved_bytes(self, n: int, num: Numerics) -> float:
        """Bytes this layer keeps from forward until its backward runs."""
        return 0.0

    def transient_bytes(self, n: int, num: Numerics) -> float:
        """Bytes alive only while this layer runs: its output and, in backward, that
        output's gradient."""
        return 2.0 * n * self.out_elements * num.act_bytes

    def _tag(self, ops: list[Op]) -> list[Op]:
        return [o.in_layer(self.name) for o in ops]


@dataclass(frozen=True)
class Linear(Layer):
    """y = x W^T + b over ``rows`` rows per sample (tokens for a transformer, 1 for an MLP)."""

    in_features: int
    out_features: int
    rows: int = 1
    bias: bool = True
    # Weights tied to another layer's (a GPT-2 head): computed, not counted. A bias stays
    # its own (BERT's masked-LM decoder bias).
    shared: bool = False
    tied_to: str = ""  # the layer whose weights a shared layer uses
    # The input is kept split over this many ranks and gathered again for the weight
    # gradient (Megatron-LM sequence parallelism keeps 1/t of a column-parallel input).
    input_shards: int = 1
    # The input is a tensor an earlier layer keeps already (a parallel block's MLP reading
    # the norm output its attention keeps): nothing more is kept for it.
    input_kept: bool = False

    @property
    def params(self) -> int:
        return sum(self.tensor_sizes())

    def tensor_sizes(self) -> list[int]:
        weight = [] if self.shared else [self.in_features * self.out_features]
        return [*weight, self.out_features] if self.bias else weight

    def factored_sizes(self) -> list[int]:
        # (out, in): out rows, in columns
        weight = [] if self.shared else [self.in_features + self.out_features]
        return [*weight, self.out_features] if self.bias else weight

    @property
    def out_elements(self) -> int:
        return self.rows * self.out_features

    @property
    def _rows(self) -> tuple[int, int]:
        """Stored row lengths of all three products: activations, weight and gradients."""
        return (self.in_features, self.out_features)

    def forward(self, n: int, num: Numerics) -> list[Op]:
        shape = GemmShape(n * self.rows, self.out_features, self.in_features,
                           row_lengths=self._rows, layout="nt")
        ops = [gemm_op(f"{self.name}.fwd", shape, num.matmul, num.act_bytes, layer=self.name)]
        if num.matmul == "fp8":  # the input and the weight quantized first
            ops = [*quantize_ops(f"{self.name}.x", n * self.rows * self.in_features, num),
                   *quantize_ops(f"{self.name}.w", self.in_features * self.out_features, num),
                   *ops]
        return self._tag(ops)

    def backward_input(self, n: int, num: Numerics) -> list[Op]:
        shape = GemmShape(n * self.rows, self.in_features, self.out_features,
                           row_lengths=self._rows)
        ops = [gemm_op(f"{self.name}.dgrad", shape, num.matmul, num.act_bytes,
                       layer=self.name)]
        if num.matmul == "fp8":  # the output gradient quantized first (both layouts)
            ops = [*quantize_ops(f"{self.name}.dy", n * self.rows * self.out_features, num),
                   *ops]
        return self._tag(ops)

    def backward_weight(self, n: int, num: Numerics) -> list[Op]:
        shape = GemmShape(self.out_features, self.in_features, n * self.rows,
                           row_lengths=self._rows, layout="tn")
        return [gemm_op(f"{self.name}.wgrad", shape, num.matmul, num.act_bytes,
                        layer=self.name)]

    def saved_bytes(self, n: int, num: Numerics) -> float:
        if self.input_kept:
            return 0.0
        return n * self.rows * self.in_features * num.act_bytes / self.input_shards


@dataclass(frozen=True)
class Conv2d(Layer):
    """A 2-D convolution, lowered to an implicit GEMM as cuDNN does."""

    in_channels: int
    out_channels: int
    kernel: int
    height: int
    width: int
    stride: int = 1
    padding: int = 0
    groups: int = 1
    bias: bool = False
    # Tensors held channels-last (model.to(memory_format=torch.channels_last)), as cuDNN's
    # tensor-core kernels want them: no transposes around the convolution.
    channels_last: bool = False

    @property
    def out_hw(self) -> tuple[int, int]:
        ho = (self.height + 2 * self.padding - self.kernel) // self.stride + 1
        wo = (self.width + 2 * self.padding - self.kernel) // self.stride + 1
        return ho, wo

    @property
    def params(self) -> int:
        weights = self.out_channels * self.in_channels // self.groups * self.kernel**2
        return weights + (self.out_channels if self.bias else 0)

    def tensor_sizes(self) -> list[int]:
        weight = [self.params - (self.out_channels if self.bias else 0)]
        return [*weight, self.out_channels] if self.bias else weight

    def factored_sizes(self) -> list[int]:
        # (out, in / groups, k, k): rows out x in x k, columns the same count
        rows = self.out_channels * (self.in_channels // self.groups) * self.kernel
        return [2 * rows, self.out_channels] if self.bias else [2 * rows]

    @property
    def out_elements(self) -> int:
        ho, wo = self.out_hw
        return self.out_channels * ho * wo

    def _bytes(self, n: int, num: Numerics) -> float:
        """Input, weights and output once each: the implicit GEMM never writes im2col."""
        inputs = n * self.in_channels * self.height * self.width
        return num.act_bytes * (inputs + self.params + n * self.out_elements)

    def _conv(self, name: str, shape: GemmShape, n: int, num: Numerics) -> Op:
        return gemm_op(name, shape, num.conv, num.act_bytes, kind="conv", layer=self.name,
                       moved=self._bytes(n, num))

    def _relayout(self, name: str, elements: int, num: Numerics) -> list[Op]:
        """Tensor-core convolutions run channels-last (NHWC); PyTorch's tensors are NCHW,
        so cuDNN transposes operands in kernels of their own. A profiled ResNet-50 step on
        an H100 (fp32 with TF32, and bf16) moved about two activation-sized transposes per
        convolution: its input in forward, its output gradient in backward (the other
        transpose kernels it ran move weights, which are small)."""
        if num.conv not in TENSOR_CORE_MATH or self.channels_last:
            return []
        return [memory_op(name, elements, elements, num.act_bytes, layer=self.name)]

    def forward(self, n: int, num: Numerics) -> list[Op]:
        ho, wo = self.out_hw
        k = self.in_channels // self.groups * self.kernel**2
        shape = GemmShape(n * ho * wo, self.out_channels // self.groups, k, self.groups)
        inputs = n * self.in_channels * self.height * self.width
        return [*self._relayout(f"{self.name}.to_nhwc", inputs, num),
                self._conv(f"{self.name}.fwd", shape, n, num)]

    def backward_input(self, n: int, num: Numerics) -> list[Op]:
        ho, wo = self.out_hw
        k = self.out_channels // self.groups * self.kernel**2
        shape = GemmShape(n * ho * wo, self.in_channels // self.groups, k, self.groups)
        return [*self._relayout(f"{self.name}.dgrad_to_nhwc", n * self.out_elements, num),
                self._conv(f"{self.name}.dgrad", shape, n, num)]

    def backward_weight(self, n: int, num: Numerics) -> list[Op]:
        ho, wo = self.out_hw
        shape = GemmShape(self.out_channels // self.groups,
                          self.in_channels // self.groups * self.kernel**2, n * ho * wo,
                          self.groups)
        return [self._conv(f"{self.name}.wgrad", shape, n, num)]

    def saved_bytes(self, n: int, num: Numerics) -> float:
        return n * self.in_channels * self.height * self.width * num.act_bytes


@dataclass(frozen=True)
class Elementwise(Layer):
    """A layer bound by memory traffic: ``elements`` per sample in and out.

    ``reads``/``writes`` count passes over the tensor in forward; ``bwd_reads``/``bwd_writes``
    in backward; ``saves`` how many such tensors stay for backward (bytes each given by
    ``saved_element_bytes``, or the activation type when 0); ``flops_per_element`` the
    arithmetic per output element.
    """

    elements: int
    reads: float = 1.0
    writes: float = 1.0
    bwd_reads: float = 2.0
    bwd_writes: float = 1.0
    saves: float = 1.0
    saved_element_bytes: float = 0.0
    flops_per_element: float = 1.0
    param_count: int = 0
    has_backward_kernel: bool = True
    # Which PyTorch op this is (relu, layer_norm, maxpool, ...) and its settings (channels,
    # width, kernel/stride/padding): what the measurement runner builds the real op from.
    op: str = ""
    args: tuple[int, ...] = ()
    inplace: bool = False  # writes over its input: no new tensor
    mask: float = 0.0  # one-byte mask elements written in forward, read in backward (dropout)
    # A norm written as separate ops that upcast a 16-bit input to fp32 (UPCAST_NORM_PASSES):
    # "cast_back" multiplies its weight after casting back (keeps an fp32 copy of the input
    # and the 16-bit normalized tensor), "fp32_weight" before (keeps both in fp32).
    upcast: str = ""
    # Its kernels are TorchInductor-generated ones, one each way, even when the model runs
    # eagerly: Megatron-LM's fused SwiGLU is written under jit_fuser, torch.compile since
    # torch 2.2 (megatron/core/jit.py, fusions/fused_bias_swiglu.py). Family <op>_compiled.
    generated: bool = False

    def tensor_sizes(self) -> list[int]:
        if self.op in ("batch_norm", "layer_norm"):  # weight and bias
            return [self.param_count // 2] * 2
        return super().tensor_sizes()

    @property
    def params(self) -> int:
        return self.param_count

    @property
    def out_elements(self) -> int:
        return self.elements

    def family(self, num: Numerics) -> str:
        """The kernels PyTorch runs for this op. Batch norm on a 16-bit input with fp32
        weights (as under autocast) takes PyTorch's own kernels; on fp32 it takes cuDNN's.
        A norm written as upcasting ops runs a chain of elementwise and reduction kernels
        (``<op>_upcast``)."""
        if self.op == "batch_norm" and num.act_bytes < DTYPE_BYTES["fp32"]:
            return "batch_norm_native"
        if self._upcasts(num):  # a chain of plain kernels, not the norm's own kernel
            return self.op + "_upcast"
        if self.generated:  # the calibration's compiled family (COMPILED_SUFFIX)
            return self.op + "_compiled"
        return self.op

    def _upcasts(self, num: Numerics) -> bool:
        return bool(self.upcast) and num.act_bytes < DTYPE_BYTES["fp32"]

    def forward(self, n: int, num: Numerics) -> list[Op]:
        e = n * self.elements
        if self._upcasts(num):
            return [memory_op(
                f"{self.name}.fwd", UPCAST_NORM_PASSES[0] * e, UPCAST_NORM_PASSES[1] * e,
                num.act_bytes, self.flops_per_element, layer=self.name,
                family=self.family(num))]
        return [memory_op(f"{self.name}.fwd", self.reads * e, self.writes * e, num.act_bytes,
                          self.flops_per_element, allocates=not self.inplace,
                          mask_written=self.mask * e, layer=self.name,
                          family=self.family(num), parallel_units=self._units)]

    @property
    def _units(self) -> int:
        return self.args[0] if self.op == "batch_norm" and self.args else 0

    def backward_input(self, n: int, num: Numerics) -> list[Op]:
        if not self.has_backward_kernel:
            return []
        e = n * self.elements
        if self._upcasts(num):
            return [memory_op(
                f"{self.name}.bwd", UPCAST_NORM_PASSES[2] * e, UPCAST_NORM_PASSES[3] * e,
                num.act_bytes, 2 * self.flops_per_element, layer=self.name,
                family=self.family(num))]
        return [memory_op(f"{self.name}.bwd", self.bwd_reads * e, self.bwd_writes * e,
                          num.act_bytes, 2 * self.flops_per_element, mask_read=self.mask * e,
                          layer=self.name, family=self.family(num),
                          parallel_units=self._units)]

    def saved_bytes(self, n: int, num: Numerics) -> float:
        if self._upcasts(num):  # the fp32 copy of its input, and the normalized tensor
            normalized = DTYPE_BYTES["fp32"] if self.upcast == "fp32_weight" else num.act_bytes
            return n * self.elements * (DTYPE_BYTES["fp32"] + normalized)
        size = self.saved_element_bytes or num.act_bytes
        return self.saves * n * self.elements * size


# An RMS norm written as PyTorch ops that upcast (x.float(), pow, mean, rsqrt, multiply,
# cast back, times the weight: Hugging Face's LlamaRMSNorm and the frameworks that copy it),
# counted op by op on a 16-bit input: (forward reads, forward writes, backward reads,
# backward writes) in passes over a 16-bit tensor. On an fp32 input (autocast's residual
# stream) the casts do nothing and it keeps what a fused norm keeps.
UPCAST_NORM_PASSES = (10.0, 8.0, 21.0, 12.0)


def relu(name: str, elements: int, *, block: str = "", inplace: bool = False) -> Elementwise:
    """ReLU. In place (torchvision's CNNs), the output it keeps for backward is the very
    tensor the next layer keeps as its input, so it adds no memory of its own."""
    return Elementwise(name, elements, saves=0 if inplace else 1, block=block, op="relu",
                       inplace=inplace)


def gelu(name: str, elements: int, *, block: str = "") -> Elementwise:
    return Elementwise(name, elements, flops_per_element=8, block=block, op="gelu")


def swiglu(name: str, elements: int, *, block: str = "", fused: bool = False) -> Elementwise:
    """silu(a) * b on two inputs of ``elements`` each, one output. Written as PyTorch ops
    (F.silu(a) * b) it keeps a for silu's backward and silu(a) and b for the product's;
    a fused kernel (Megatron-LM's) keeps its two inputs."""
    return Elementwise(name, elements, reads=2, bwd_reads=3, bwd_writes=2,
                       saves=2 if fused else 3, flops_per_element=6, block=block, op="swiglu")


def dropout(name: str, elements: int, *, block: str = "") -> Elementwise:
    """Keeps a bool mask (one byte an element whatever the data type); writes the mask in
    forward, reads it in backward."""
    return Elementwise(name, elements, bwd_reads=1, mask=1, saves=1, saved_element_bytes=1,
                       block=block, op="dropout")


def residual_add(name: str, elements: int, *, block: str = "", branches: int = 1
                 ) -> Elementwise:
    """x + f(x) (``branches`` 2: x + f(x) + g(x), a parallel block's); in backward the
    gradient fans out and autograd accumulates it once into each."""
    return Elementwise(name, elements, reads=1 + branches, bwd_reads=1 + branches, saves=0,
                       block=block, op="add")


def batch_norm(name: str, channels: int, elements: int, *, block: str = "") -> Elementwise:
    """Training-mode batch norm: a statistics pass, then normalize (cuDNN's two-pass kernels)."""
    return Elementwise(name, elements, reads=2, bwd_reads=3, flops_per_element=4,
                       param_count=2 * channels, block=block, op="batch_norm", args=(channels,))


def layer_norm(name: str, width: int, rows: int, *, block: str = "") -> Elementwise:
    return Elementwise(name, width * rows, flops_per_element=5, param_count=2 * width,
                       block=block, op="layer_norm", args=(width,))


def rms_norm(name: str, width: int, rows: int, *, block: str = "") -> Elementwise:
    return Elementwise(name, width * rows, flops_per_element=4, param_count=width, block=block,
                       op="rms_norm", args=(width,))


def softmax(name: str, elements: int, *, block: str = "") -> Elementwise:
    return Elementwise(name, elements, flops_per_element=5, block=block, op="softmax")


def pool(name: str, in_elements: int, out_elements: int, *, block: str = "",
         op: str = "maxpool", args: tuple[int, ...] = ()) -> Elementwise:
    """Pooling: reads the input, writes the (smaller) output. ``op`` is maxpool or avgpool
    with ``args`` (kernel, stride, padding), or adaptive_avgpool with ``args`` (size,)."""
    ratio = in_elements / max(out_elements, 1)
    return Elementwise(name, out_elements, reads=ratio, bwd_reads=1 + ratio / 4,
                       bwd_writes=ratio, saves=ratio, block=block, op=op, args=args)
