"""Ops: the kernels a layer launches, with the FLOP and byte rules of each kind.

An ``Op`` is one GPU kernel (or one CPU operator) with concrete FLOPs and bytes for a given
batch and precision. Layers produce ops for the forward pass, the input-gradient and the
weight-gradient halves of the backward pass; the cost model turns each op into seconds.

Conventions: a multiply-add is 2 FLOP; bytes count every read and write of global memory
once (what a well-fused kernel moves); matrix products are (m x k) @ (k x n), ``batch`` times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OpKind = Literal["gemm", "conv", "attention", "memory"]
Phase = Literal["forward", "backward", "optimizer", "recompute"]

# Bytes per element of each storage type.
DTYPE_BYTES: dict[str, int] = {
    "fp64": 8,
    "fp32": 4,
    "tf32": 4,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "int8": 1,
    "int64": 8,
}

# The type an fp8 product writes its result in: torch._scaled_mm as the micro suite calls
# it (out_dtype=torch.bfloat16) and Transformer Engine's and torchao's fp8 linear layers.
FP8_RESULT = "bf16"


def result_bytes(math: str) -> int:
    """Bytes per element of a product's result in precision ``math`` (fp8's is 16-bit)."""
    return DTYPE_BYTES[FP8_RESULT if math == "fp8" else math]


# Math precisions that run on tensor cores (or a CPU's matrix units).
TENSOR_CORE_MATH = frozenset({"tf32", "fp16", "bf16", "fp8", "int8"})

# Row alignment cuBLAS and CUTLASS need for their fastest (16-byte vector load) kernels;
# misaligned operands fall back to narrower loads (cuBLAS docs, "Tensor Core Usage").
ALIGN_BYTES = 16


@dataclass(frozen=True, slots=True)
class GemmShape:
    """A (batched) matrix product: ``batch`` independent (m x k) @ (k x n) products.

    ``row_lengths`` are the contiguous (innermost) lengths of the operands as stored; empty
    means row-major A @ B into C, whose rows are k and n long. A linear layer's three
    products all store rows of its in and out features, whichever way they are transposed.
    """

    m: int
    n: int
    k: int
    batch: int = 1
    row_lengths: tuple[int, ...] = ()
    # How the operands are stored, as BLAS names it: nn (A @ B, both row-major, as torch.mm
    # and the micro suite's GEMMs), nt (A @ B^T: a linear layer's forward), tn (A^T @ B: its
    # weight gradient). cuBLAS picks different kernels for each.
    layout: str = "nn"

    def aligned(self, element_bytes: float, align_bytes: int = ALIGN_BYTES) -> bool:
        """Whether every stored row starts on an ``align_bytes`` boundary, as the fastest
        tensor-core kernels need for their wide loads."""
        rows = self.row_lengths or (self.k, self.n)
        return all((r * element_bytes) % align_bytes == 0 for r in rows)

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch

    def bytes(self, element_bytes: float, operand_bytes: float | None = None) -> float:
        """Operands read once (``operand_bytes`` each; none: ``element_bytes``) and the
        result written once."""
        operand = element_bytes if operand_bytes is None else operand_bytes
        return self.batch * (operand * (self.m * self.k + self.k * self.n)
                             + element_bytes * self.m * self.n)


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """A fused attention kernel's problem: ``batch`` independent (sample, head) pairs of
    ``queries`` rows against ``keys``, with the causal mask or without."""

    batch: int
    queries: int
    keys: int
    causal: bool
    window: int = 0  # sliding window (0: every key)
    head_dim: int = 128


@dataclass(frozen=True, slots=True)
class Op:
    """One kernel: what it computes, how much, and where it belongs in the step.

    ``math`` is the precision the arithmetic runs in (it picks tensor cores or ordinary cores);
    ``gemm`` is set for matrix products and convolutions (as implicit GEMMs), which the cost
    model quantizes into tiles and waves.
    """

    name: str
    kind: OpKind
    flops: float
    bytes: float
    math: str
    layer: str = ""
    phase: Phase = "forward"
    gemm: GemmShape | None = None
    # Bytes of new output the op allocates (eager PyTorch allocates every result; in-place
    # ops none). Large fresh allocations cost a CPU page faults on first touch.
    alloc_bytes: float = 0.0
    # The kernel family of a memory-bound op (batch_norm, batch_norm_native, ...): families
    # whose kernels reach less of the bandwidth than a streaming copy get a fitted factor.
    family: str = ""
    # Independent pieces of work the kernels split the op into (0: plenty). Batch norm
    # reduces each channel over the batch and image in one thread block per channel, so
    # with fewer channels than SMs part of the GPU sits idle.
    parallel_units: int = 0
    # A named implementation whose own efficiency the calibration may state (attention:
    # flash2, cudnn, efficient); empty: the kind's default.
    kernel: str = ""
    # A fused attention kernel's problem, which the cost model splits into tiles.
    attention: AttentionShape | None = None
    # Bytes of the result a matrix product writes after its main loop (its epilogue).
    written: float = 0.0
    # Kernels the op is launched as, equal parts of it, from one framework call (a library's
    # loop over experts), ``streams`` of them running at once (issued round-robin on that
    # many streams, Transformer Engine's multi-stream GEMMs and casts). A product's ``gemm``
    # is then all of them stacked (batch), as they would run as one grouped kernel.
    launches: int = 1
    streams: int = 1
    # The host waits for the device before dispatching the op: it reads back a value the
    # op needs (an MoE dispatch's tokens per expert, as split sizes on the host).
    syncs: bool = False

    def with_phase(self, phase: Phase) -> Op:
        # An Op is immutable: one already in ``phase`` (or ``layer``, below) is its own copy.
        return self if phase == self.phase else self._with(self.layer, phase)

    def in_layer(self, layer: str) -> Op:
        return self if layer == self.layer else self._with(layer, self.phase)

    def _with(self, layer: str, phase: Phase) -> Op:
        # Every field by name: 2.5x faster than dataclasses.replace, which lowering calls
        # for every op of every layer (tests/test_cost.py checks it against replace).
        return Op(name=self.name, kind=self.kind, flops=self.flops, bytes=self.bytes,
                  math=self.math, layer=layer, phase=phase, gemm=self.gemm,
                  alloc_bytes=self.alloc_bytes, family=self.family,
                  parallel_units=self.parallel_units, kernel=self.kernel,
                  attention=self.attention, written=self.written, launches=self.launches,
                  streams=self.streams, syncs=self.syncs)


def gemm_op(name: str, shape: GemmShape, math: str, element_bytes: float,
            kind: OpKind = "gemm", *, layer: str = "", moved: float | None = None) -> Op:
    """A matrix product (or a convolution lowered to one), writing a new result of
    ``element_bytes`` elements, in ``layer``; an fp8 product reads its operands quantized to
    one byte (the casts before it wrote them) and writes a 16-bit result. ``moved``: its
    bytes where they are not the product's own (a convolution's)."""
    out = element_bytes * shape.batch * shape.m * shape.n
    operand = DTYPE_BYTES["fp8"] if math == "fp8" else element_bytes
    return Op(name, kind, shape.flops,
              shape.bytes(element_bytes, operand) if moved is None else moved,
              math, layer, gemm=shape, alloc_bytes=out, written=out)


def memory_op(name: str, elements_read: float, elements_written: float, element_bytes: float,
              flops_per_element: float = 1.0, *, allocates: bool = True,
              mask_read: float = 0.0, mask_written: float = 0.0, layer: str = "",
              phase: Phase = "forward", family: str = "", parallel_units: int = 0) -> Op:
    """An elementwise, normalization, reduction or copy kernel: bound by the bytes it moves.

    ``flops_per_element`` counts arithmetic per element written; it matters only on devices
    whose arithmetic is slow next to their memory (CPUs with narrow SIMD). ``allocates``:
    the written elements are a new tensor (False for in-place ops). ``mask_read`` and
    ``mask_written`` count one-byte elements (a dropout mask is bool whatever the data type).
    ``layer``, ``phase``, ``family`` and ``parallel_units`` are the Op's own fields.
    """
    written = element_bytes * elements_written + mask_written
    return Op(
        name,
        "memory",
        flops_per_element * elements_written,
        element_bytes * elements_read + mask_read + written,
        "fp32",
        layer,
        phase,
        alloc_bytes=written if allocates else 0.0,
        family=family,
        parallel_units=parallel_units,
    )
