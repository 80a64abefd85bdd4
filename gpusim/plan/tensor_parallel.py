"""Megatron-LM tensor parallelism: the part of a layer one rank holds, and the collectives
its passes issue.

A forward all-reduce follows every row-parallel layer and the vocabulary-parallel embedding;
a backward all-reduce follows every column-parallel layer's input gradient. With sequence
parallelism each all-reduce becomes a reduce-scatter plus an all-gather, and the layers
between them (norms, dropout, residual adds) run on 1/t of the tokens. A column-parallel
layer then keeps only its sequence shard of the input (``Linear.input_shards``), so its
backward pass gathers the input again for the weight gradient, overlapped with the
input-gradient GEMM, and reduce-scatters the input gradient overlapped with the
weight-gradient GEMM (Korthikanti et al. 2022; megatron/core/tensor_parallel/layers.py,
LinearWithGradAccumulationAndAsyncCommunication saves the input shard and gathers it in
backward).

PyTorch's parallel styles (torch.distributed.tensor.parallel, a stack whose
``tensor_parallel`` is dtensor) split the layers alike but gather a sequence-parallel input
once, before the module (PrepareModuleInput, ColwiseParallel: Shard(1) redistributed to
Replicate), and autograd keeps that gathered tensor for the weight gradient: the memory plan
counts all ``input_shards`` of it (gpusim.plan.memory), and backward gathers nothing again,
only reduce-scatters the input gradient (the redistribution's backward), after the layer's
products (what ``tp_collectives`` issues when its caller passes ``kept_gathered``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Literal

from gpusim.comm.collectives import Collective
from gpusim.workload.attention import Attention, CrossEntropy, Embedding
from gpusim.workload.layers import Elementwise, Layer, Linear
from gpusim.workload.moe import MoE
from gpusim.workload.ops import DTYPE_BYTES


def pad_vocab(layer: Layer, multiple: int) -> Layer:
    """A layer that splits the vocabulary (embedding, logits, loss) over a vocabulary padded
    with dummy tokens to a multiple of ``multiple``, as the stack pads it (Stack.vocab_multiple
    times TP); others as they are."""
    if multiple <= 1 or layer.tp != "vocab":
        return layer

    def up(v: int) -> int:
        return -(-v // multiple) * multiple

    if isinstance(layer, Embedding):
        return replace(layer, num_embeddings=up(layer.num_embeddings))
    if isinstance(layer, Linear):
        return replace(layer, out_features=up(layer.out_features))
    if isinstance(layer, CrossEntropy):
        return replace(layer, classes=up(layer.classes))
    return layer


def shard_layer(layer: Layer, tensor: int, sequence_parallel: bool) -> Layer:
    """The part of ``layer`` one tensor-parallel rank holds and computes."""
    t = tensor
    if t == 1 or layer.tp == "replicated":
        return layer
    if layer.tp == "sequence":
        if sequence_parallel and isinstance(layer, Elementwise):
            return replace(layer, elements=math.ceil(layer.elements / t))
        return layer
    if isinstance(layer, Linear):
        if layer.tp == "row":
            return replace(layer, in_features=math.ceil(layer.in_features / t))
        shards = t if sequence_parallel else 1
        return replace(layer, out_features=math.ceil(layer.out_features / t),  # column, vocab
                       input_shards=shards)
    if isinstance(layer, Attention):
        kv = layer.kv_heads or layer.heads
        return replace(layer, heads=layer.heads // t, kv_heads=max(1, kv // t))
    if isinstance(layer, MoE):  # each expert's MLP split as a dense one (expert TP = TP)
        return replace(layer, ffn=math.ceil(layer.ffn / t),
                       shared_ffn=math.ceil(layer.shared_ffn / t))
    if isinstance(layer, Embedding):
        return replace(layer, num_embeddings=math.ceil(layer.num_embeddings / t))
    if isinstance(layer, CrossEntropy):
        return replace(layer, classes=math.ceil(layer.classes / t))
    if isinstance(layer, Elementwise):
        return replace(layer, elements=math.ceil(layer.elements / t))
    return layer


Overlap = Literal["fwd", "dgrad", "wgrad"] | None


def tp_collectives(layer: Layer, phase: str, n: int, act: int, tensor: int, sp: bool,
                   overlap: bool = False, input_bytes: float | None = None,
                   kept_gathered: bool = False) -> list[tuple[Collective, float, Overlap]]:
    """Tensor-parallel collectives a layer's pass issues for ``n`` samples with ``act``-byte
    activations: (collective, bytes of the full buffer as nccl-tests counts it, the layer's
    GEMM it runs beside, or None when it sits on the critical path). With ``overlap``
    (Megatron-LM's --tp-comm-overlap, PyTorch's async TP; sequence parallelism only) the
    gathers before a linear layer's products and the reduce-scatters after them run in
    chunks beside those products too. ``input_bytes``: what a column-parallel layer's
    forward gathers per input element when it casts before gathering (fp8: torchao's
    Float8ColwiseParallel, Transformer Engine's fp8 norm output); default ``act``.
    ``kept_gathered``: the column-parallel layer kept its gathered input (PyTorch's parallel
    styles, Stack.tensor_parallel dtensor), so its backward only reduce-scatters the input
    gradient: the redistribution's backward, after the layer's autograd node has run both
    products (beside the input-gradient product where async TP fuses the two)."""
    beside: Overlap = "fwd" if overlap and sp else None
    if tensor == 1:
        return []
    if isinstance(layer, CrossEntropy) and layer.tp == "vocab" and phase != "backward":
        # Vocabulary-parallel cross-entropy: max, sum of exponentials and target logit.
        return [("all_reduce", n * layer.rows * DTYPE_BYTES["fp32"], None)] * 3
    if isinstance(layer, Embedding) and layer.tp == "vocab":
        size = n * layer.rows * layer.dim * act
        return [] if phase == "backward" else [
            ("reduce_scatter" if sp else "all_reduce", size, None)]
    if isinstance(layer, MoE) and layer.tp != "replicated":  # as a dense MLP's pair
        size = n * layer.rows * layer.hidden * act
        if phase == "backward":
            return ([("all_gather", size, None), ("reduce_scatter", size, None)] if sp
                    else [("all_reduce", size, None)])
        return ([("all_gather", size, None), ("reduce_scatter", size, None)] if sp
                else [("all_reduce", size, None)])
    if not isinstance(layer, Linear):
        return []
    if layer.tp == "row":
        size = n * layer.rows * layer.out_features * act
        if phase == "backward":
            return [("all_gather", size, "dgrad" if beside else None)] if sp else []
        return [("reduce_scatter" if sp else "all_reduce", size, beside)]
    if layer.tp in ("column", "vocab"):
        size = n * layer.rows * layer.in_features * act
        if phase == "backward":
            if sp and kept_gathered:
                return [("reduce_scatter", size, "dgrad" if beside else None)]
            if sp:
                return [("all_gather", size, "dgrad"), ("reduce_scatter", size, "wgrad")]
            return [("all_reduce", size, None)]
        return [("all_gather", size * (input_bytes or act) / act, beside)] if sp else []
    return []
