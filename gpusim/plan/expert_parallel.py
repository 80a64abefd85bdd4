"""Expert parallelism: each of ``expert`` ranks holds 1/expert of every MoE layer's experts.

The ranks are data-parallel ranks (Megatron-LM and torchtitan carve the expert group out of
them): each routes its own tokens, sends every copy to the rank holding its expert
(all-to-all) and takes the results back (gpusim.workload.moe.ep_collectives). An expert's
weights live on data/expert ranks only, so ZeRO and FSDP shard them over that many, and
their gradients are reduced among those ranks.
"""

from __future__ import annotations

import math
from dataclasses import replace

from gpusim.errors import InvalidConfig
from gpusim.workload.layers import Layer
from gpusim.workload.model import Model
from gpusim.workload.moe import MoE


def check_experts(model: Model, expert: int) -> None:
    if expert == 1:
        return
    moes = [la for la in model.layers if isinstance(la, MoE)]
    if not moes:
        raise InvalidConfig(f"expert parallelism splits experts; {model.name} has no mixture "
                            f"of experts (use --ep 1)")
    if moes[0].experts % expert:
        raise InvalidConfig(f"{model.name} has {moes[0].experts} experts per layer, which do "
                            f"not split over EP {expert}; pick an EP that divides them")


def hold_experts(layer: Layer, expert: int, all_to_all: bool = True,
                 imbalance: float = 1.0, capacity: float = 0.0, pad: bool = False) -> Layer:
    """The part of ``layer`` one expert-parallel rank holds, as the busiest rank holds it
    (``imbalance``: its token copies over the mean). Experts with a ``capacity`` (a factor
    of the mean, Megatron-LM's --moe-expert-capacity-factor) drop the copies beyond it, or
    with ``pad`` compute exactly that many (--moe-pad-expert-input-to-capacity). Over a
    plain all-to-all (``all_to_all``; not DeepEP's or HybridEP's per-token dispatch) the
    tokens a rank receives, arranged by sending rank, are sorted by local expert where it
    holds several."""
    if not isinstance(layer, MoE):
        return layer
    load = imbalance if expert > 1 else 1.0
    if capacity:
        load = capacity if pad else min(load, capacity)
    if expert == 1:
        return replace(layer, load=load) if load != 1.0 else layer
    local = layer.experts // expert
    return replace(layer, local_experts=local, sorts_by_expert=all_to_all and local > 1,
                   load=load)


def fold_experts(layer: Layer, tensor: int, expert_tensor: int) -> Layer:
    """An MoE layer when expert parallelism spans tensor-parallel ranks: each rank routes
    its own 1/TP of the tokens (sequence parallelism has split them) to experts split over
    ``expert_tensor`` ranks only, with no tensor-parallel collective of its own (its tokens
    stay split); None of this when EP fits inside the data-parallel ranks."""
    if not isinstance(layer, MoE) or expert_tensor == tensor:
        return layer
    return replace(layer, rows=math.ceil(layer.rows / tensor),
                   ffn=math.ceil(layer.ffn / expert_tensor),
                   shared_ffn=math.ceil(layer.shared_ffn / expert_tensor), tp="replicated")


def expert_share(layers: tuple[Layer, ...] | list[Layer]) -> float:
    """The fraction of these layers' parameters (as one rank holds them) that are experts."""
    total = sum(la.params for la in layers)
    experts = sum(la.expert_params for la in layers if isinstance(la, MoE))
    return experts / total if total else 0.0
