"""Context parallelism: each sample's sequence split over ``context`` ranks, as PyTorch's
``context_parallel`` runs it under torchtitan.

Every layer but attention works on its rank's slice of the tokens alone. Attention needs
every key: the rank's queries attend over the whole sequence, so the group all-gathers K and
V before the kernel (torch's default "allgather" rotation), gathers them again in backward
and reduce-scatters their gradients. With the causal mask, each rank holds matching chunks
from both ends of the sequence (torchtitan's load balancing), so every rank does the same
half of the work. For weights and gradients the context ranks are data-parallel ranks like
the others: FSDP shards over DP x CP and the gradients are reduced over both.
"""

from __future__ import annotations

import math
from dataclasses import replace

from gpusim.comm.collectives import Collective
from gpusim.errors import InvalidConfig
from gpusim.workload.attention import Attention, CrossEntropy, Embedding
from gpusim.workload.layers import Elementwise, Layer, Linear
from gpusim.workload.lora import LoraAdapter
from gpusim.workload.model import Model
from gpusim.workload.moe import MoE


def check_context(model: Model, context: int) -> None:
    """Refuse what context parallelism cannot split, with the reason."""
    if context == 1:
        return
    if model.family != "transformer" or not model.tokens_per_sample:
        raise InvalidConfig(f"context parallelism splits a sequence; {model.name} is a "
                            f"{model.family} model (use --cp 1)")
    seq = model.tokens_per_sample
    if seq % (2 * context):
        raise InvalidConfig(f"--cp {context} splits each sequence into {2 * context} chunks "
                            f"(two per rank, for balance under the causal mask); sequence "
                            f"{seq} is not a multiple of {2 * context}")
    for layer in model.layers:
        if isinstance(layer, Attention) and not layer.fused:
            raise InvalidConfig("context parallelism runs attention through SDPA's fused "
                                "kernels; math (unfused) attention cannot be split (use "
                                "--attention auto or a fused kernel)")
        if not isinstance(layer, (Attention, CrossEntropy, Embedding, Elementwise, Linear,
                                  LoraAdapter, MoE)):
            raise InvalidConfig(f"context parallelism cannot split {layer.name} "
                                f"({type(layer).__name__})")


def split_sequence(layer: Layer, context: int) -> Layer:
    """The part of ``layer`` one context-parallel rank computes: its 1/context of the tokens
    (attention: its queries, against every key)."""
    if context == 1:
        return layer
    if isinstance(layer, Attention):
        return replace(layer, seq=layer.seq // context, kv_seq=layer.keys, cp_steps=context)
    if isinstance(layer, (Linear, LoraAdapter, Embedding, CrossEntropy, MoE)):
        return replace(layer, rows=math.ceil(layer.rows / context))
    if isinstance(layer, Elementwise):
        return replace(layer, elements=math.ceil(layer.elements / context))
    return layer


def cp_collectives(layer: Layer, phase: str, n: int, act: int
                   ) -> list[tuple[Collective, float]]:
    """The collectives one attention layer's pass issues over the context group, for ``n``
    samples: (collective, bytes of the gathered buffer as nccl-tests counts it)."""
    if not isinstance(layer, Attention) or layer.keys == layer.seq:
        return []
    kv = layer.heads if layer.expand_kv else layer.kv_heads or layer.heads  # as SDPA gets them
    size = 2.0 * n * layer.keys * kv * layer.head_dim * act  # K and V, every rank's slice
    if phase == "forward" or phase == "recompute":
        return [("all_gather", size)]
    return [("all_gather", size), ("reduce_scatter", size)]
