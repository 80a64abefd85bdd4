"""Mixture of experts: a router sends each token to ``top_k`` of ``experts`` expert MLPs.

Costed as the dropless grouped-GEMM path that Megatron-LM (``--moe-grouped-gemm``) and
torchtitan run: the router's product and top-k, a gather of every token's copies into expert
order, each expert's products over the tokens routed to it (one batched product per
projection, or one GEMM per expert on a few streams where the stack runs them so:
``expert_streams``), the gated activation, and a weighted scatter back; where the stack's
dispatcher reads the token counts back to the host, the forward waits there (``host_sync``).
Routing is taken as balanced (the load-balancing loss's aim): every expert sees
``tokens x top_k / experts`` rows.
Shared experts (DeepSeek, Qwen2-MoE) run on every token as a dense MLP beside them.

In fp8 training the experts' and shared experts' products run in fp8 and quantize their
inputs, weights and output gradients first, as a linear layer's do (Transformer Engine's
GroupedLinear under fp8_autocast); the router is no Transformer Engine module and runs in
the activations' type (Megatron-LM megatron/core/transformer/moe/router.py @d98e8a64dd:
router_gating_linear in input.dtype unless moe_router_dtype says fp32).

Under expert parallelism (``ep`` ranks, ``local_experts`` each) a rank computes its own
experts over every rank's tokens routed to them, exchanged by all-to-alls before and after
(``ep_collectives``); with balanced routing that is as many rows as its own tokens x top_k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from gpusim.comm.collectives import Collective
from gpusim.workload.fp8 import quantize_ops
from gpusim.workload.layers import Layer
from gpusim.workload.numerics import Numerics
from gpusim.workload.ops import DTYPE_BYTES, GemmShape, Op, gemm_op, memory_op

# When the host reads an MoE layer's tokens per expert back before the dispatch, waiting for
# the device: never, with_ep (only to exchange tokens between ranks), always
HostSync = Literal["never", "with_ep", "always"]


@dataclass(frozen=True)
class MoE(Layer):
    hidden: int
    ffn: int  # each expert's hidden size
    experts: int
    top_k: int
    rows: int = 1  # tokens per sample
    gated: bool = True  # SwiGLU experts (up and gate projections)
    shared_ffn: int = 0  # hidden size of the always-on shared experts (0: none)
    local_experts: int = 0  # experts this rank holds under expert parallelism (0: all)
    # Group-limited routing (DeepSeek-V3's n_group, topk_group): the experts fall in
    # ``groups`` equal groups and each token picks its top_k among ``groups_per_token`` of
    # them (0: any expert)
    groups: int = 0
    groups_per_token: int = 0
    # How the experts' products run: 0, one grouped kernel per product over every expert
    # (torch._grouped_mm); N, one GEMM per expert issued round-robin on N streams, each
    # operand cast per expert the same way (Transformer Engine's GroupedLinear on cuBLAS)
    expert_streams: int = 0
    # When the host reads the tokens per expert back (split sizes for the all-to-all, or
    # for per-expert products): HostSync
    host_sync: HostSync = "never"
    # Whether the token copies an all-to-all brings, arranged by the rank that sent them,
    # are sorted by local expert before the experts and back after: one pass each way over
    # them in forward and in backward (Megatron-LM's "permutation 2", token_dispatcher.py
    # sort_chunks_by_idxs @d98e8a64dd; torchtitan's _permute and _unpermute, models/common/
    # token_dispatcher.py @b5bcd76c66). DeepEP and HybridEP hand tokens over per token, and
    # the local permute (``permute``) groups them.
    sorts_by_expert: bool = False
    # Whether a plain all-to-all dispatch sends each copy's routing weight in an all-to-all
    # of its own, forward and backward (Megatron-LM's alltoall dispatcher)
    dispatches_probs: bool = False
    # The token copies this rank's experts compute over the mean: the busiest rank's under
    # uneven routing (--moe-imbalance; every rank waits for it at each all-to-all, so its
    # expert work and the bytes it receives set the pace), the capacity where experts drop
    # tokens beyond it or pad up to it (--capacity-factor). 1: balanced and dropless
    load: float = 1.0

    @property
    def held(self) -> int:
        return self.local_experts or self.experts

    @property
    def _up(self) -> int:
        return 2 * self.ffn if self.gated else self.ffn

    @property
    def _shared_up(self) -> int:
        return 2 * self.shared_ffn if self.gated else self.shared_ffn

    @property
    def expert_params(self) -> int:
        """Parameters of the experts this rank holds (what expert parallelism divides)."""
        return self.held * (self._up + self.ffn) * self.hidden

    @property
    def params(self) -> int:
        router = self.hidden * self.experts
        shared = (self._shared_up + self.shared_ffn) * self.hidden
        return router + shared + self.expert_params

    @property
    def active_params(self) -> int:
        """The router, the shared experts and top_k experts: what one token computes with."""
        return self.params - self.expert_params + self.top_k * (self._up + self.ffn) * self.hidden

    def tensor_sizes(self) -> list[int]:
        # the router, then each projection's experts stacked in one tensor (grouped GEMM)
        sizes = [self.hidden * self.experts, self.held * self._up * self.hidden,
                 self.held * self.ffn * self.hidden]
        if self.shared_ffn:
            sizes += [self._shared_up * self.hidden, self.shared_ffn * self.hidden]
        return sizes

    def factored_sizes(self) -> list[int]:
        # stacked experts (experts, out, in): rows experts x out, columns experts x in
        e = self.held
        sizes = [self.hidden + self.experts, e * (self._up + self.hidden),
                 e * (self.hidden + self.ffn)]
        if self.shared_ffn:
            sizes += [self._shared_up + self.hidden, self.hidden + self.shared_ffn]
        return sizes

    @property
    def out_elements(self) -> int:
        return self.rows * self.hidden

    @property
    def ep(self) -> int:
        return self.experts // self.held

    @property
    def syncs_host(self) -> bool:
        """Whether the forward pass waits for the device to read its token counts."""
        return self.host_sync == "always" or (self.host_sync == "with_ep" and self.ep > 1)

    def _sent(self, n: int) -> int:
        """Token copies this rank routes (its own tokens times top_k)."""
        return n * self.rows * self.top_k

    def _routed(self, n: int) -> int:
        """Token copies this rank's experts compute (every rank's, routed to them): the
        mean, or as many more or fewer as ``load`` says."""
        copies = self._sent(n)
        return math.ceil(copies * self.load) if self.load != 1.0 else copies

    def _expert(self, tag: str, n: int, out: int, inner: int, layout: str,
                num: Numerics) -> Op:
        per_expert = max(1, self._routed(n) // self.held)
        # the stored rows are the hidden sizes, whatever an expert's token count
        shape = GemmShape(per_expert, out, inner, batch=self.held, layout=layout,
                          row_lengths=(inner, out))
        return self._per_expert(gemm_op(f"{self.name}.{tag}", shape, num.matmul,
                                        num.act_bytes))

    def _per_expert(self, op: Op) -> Op:
        """An op over every local expert as the stack launches it: one kernel, or one per
        expert on ``expert_streams`` streams."""
        if not self.expert_streams or self.held < 2:
            return op
        return replace(op, launches=self.held, streams=self.expert_streams)

    def _dense(self, tag: str, m: int, out: int, inner: int, layout: str,
               num: Numerics) -> Op:
        return gemm_op(f"{self.name}.{tag}", GemmShape(m, out, inner, layout=layout),
                       num.matmul, num.act_bytes)

    def _router(self, tag: str, m: int, out: int, inner: int, layout: str,
                num: Numerics) -> Op:
        """The router's product: never fp8 (see the module's docstring), but in fp8
        training's 16-bit type (TrainingJob.numerics: bf16 beside fp8)."""
        math = "bf16" if num.matmul == "fp8" else num.matmul
        return gemm_op(f"{self.name}.{tag}", GemmShape(m, out, inner, layout=layout),
                       math, num.act_bytes)

    def _sorted(self, tag: str, copies: int, act: int) -> list[Op]:
        """One pass over the token copies reordering them between rank-major and
        expert-major (``sorts_by_expert``; nothing otherwise)."""
        if not self.sorts_by_expert:
            return []
        return [memory_op(f"{self.name}.{tag}", copies * self.hidden, copies * self.hidden,
                          act, 0)]

    def _quantized(self, tag: str, elements: float, num: Numerics) -> list[Op]:
        """An fp8 product's operand quantized first (nothing outside fp8 training), expert
        by expert where the experts' products run so."""
        if num.matmul != "fp8":
            return []
        ops = quantize_ops(f"{self.name}.{tag}", elements, num)
        return ([self._per_expert(op) for op in ops] if tag.startswith("experts_")
                else ops)

    def forward(self, n: int, num: Numerics) -> list[Op]:
        t, h, e, sent = n * self.rows, self.hidden, self._routed(n), self._sent(n)
        a = num.act_bytes
        q = self._quantized
        held = self.held
        ops = [
            self._router("router", t, self.experts, h, "nt", num),
            # softmax over the experts and top-k, in fp32: scores in, weights and indices out
            memory_op(f"{self.name}.topk", t * self.experts, 2 * t * self.top_k,
                      DTYPE_BYTES["fp32"], 5),
            replace(memory_op(f"{self.name}.permute", sent * h, sent * h, a, 0),
                    syncs=self.syncs_host),
            *self._sorted("sort_by_expert", e, a),
            *q("experts_up.x", e * h, num), *q("experts_up.w", held * self._up * h, num),
            self._expert("experts_up", n, self._up, h, "nt", num),
            memory_op(f"{self.name}.act", (2 if self.gated else 1) * e * self.ffn,
                      e * self.ffn, a, 6),
            *q("experts_down.x", e * self.ffn, num),
            *q("experts_down.w", held * h * self.ffn, num),
            self._expert("experts_down", n, h, self.ffn, "nt", num),
            *self._sorted("unsort", e, a),
            # each copy scaled by its routing weight and summed back into its token
            memory_op(f"{self.name}.unpermute", sent * h, t * h, a, 2),
        ]
        if self.shared_ffn:
            up, ffn = self._shared_up, self.shared_ffn
            ops += [*q("shared_up.x", t * h, num), *q("shared_up.w", up * h, num),
                    self._dense("shared_up", t, up, h, "nt", num),
                    memory_op(f"{self.name}.shared_act", 2 * t * ffn, t * ffn, a, 6),
                    *q("shared_down.x", t * ffn, num), *q("shared_down.w", h * ffn, num),
                    self._dense("shared_down", t, h, ffn, "nt", num),
                    memory_op(f"{self.name}.shared_add", 2 * t * h, t * h, a, 1)]
        return self._tag(ops)

    def backward_input(self, n: int, num: Numerics) -> list[Op]:
        t, h, e, sent = n * self.rows, self.hidden, self._routed(n), self._sent(n)
        a = num.act_bytes
        q = self._quantized
        ops = [
            memory_op(f"{self.name}.unpermute_bwd", t * h + sent * h, sent * h, a, 2),
            *self._sorted("unsort_bwd", e, a),
            *q("experts_down.dy", e * h, num),
            self._expert("experts_down_dgrad", n, self.ffn, h, "nn", num),
            memory_op(f"{self.name}.act_bwd", 3 * e * self.ffn, 2 * e * self.ffn, a, 12),
            *q("experts_up.dy", e * self._up, num),
            self._expert("experts_up_dgrad", n, h, self._up, "nn", num),
            *self._sorted("sort_by_expert_bwd", e, a),
            memory_op(f"{self.name}.permute_bwd", sent * h, t * h, a, 1),  # copies summed
            memory_op(f"{self.name}.topk_bwd", 2 * t * self.experts, t * self.experts,
                      DTYPE_BYTES["fp32"], 5),
            self._router("router_dgrad", t, h, self.experts, "nn", num),
        ]
        if self.shared_ffn:
            up, ffn = self._shared_up, self.shared_ffn
            ops += [*q("shared_down.dy", t * h, num),
                    self._dense("shared_down_dgrad", t, ffn, h, "nn", num),
                    memory_op(f"{self.name}.shared_act_bwd", 3 * t * ffn, 2 * t * ffn, a, 12),
                    *q("shared_up.dy", t * up, num),
                    self._dense("shared_up_dgrad", t, h, up, "nn", num)]
        return self._tag(ops)

    def backward_weight(self, n: int, num: Numerics) -> list[Op]:
        t, h = n * self.rows, self.hidden
        per_expert = max(1, self._routed(n) // self.held)

        def wgrad(tag: str, out: int, inner: int) -> Op:
            shape = GemmShape(out, inner, per_expert, batch=self.held, layout="tn",
                              row_lengths=(out, inner))
            return self._per_expert(gemm_op(f"{self.name}.{tag}", shape, num.matmul,
                                            num.act_bytes))

        ops = [wgrad("experts_up_wgrad", self._up, h), wgrad("experts_down_wgrad", h, self.ffn),
               self._router("router_wgrad", self.experts, h, t, "tn", num)]
        if self.shared_ffn:
            ops += [self._dense("shared_up_wgrad", self._shared_up, h, t, "tn", num),
                    self._dense("shared_down_wgrad", h, self.shared_ffn, t, "tn", num)]
        return self._tag(ops)

    def saved_bytes(self, n: int, num: Numerics) -> float:
        """The router's input and scores, the permuted copies, each expert's up output
        and activation (the down product's input), and the shared experts' likewise."""
        t, h, e = n * self.rows, self.hidden, self._routed(n)
        a = num.act_bytes
        kept = t * h * a + t * self.experts * DTYPE_BYTES["fp32"] + e * h * a
        kept += e * (self._up + self.ffn) * a
        if self.shared_ffn:
            kept += t * (self._shared_up + self.shared_ffn) * a
        return float(kept)

    def product_input_bytes(self, n: int, num: Numerics) -> float:
        """What saved_bytes keeps of the experts' products' own inputs (the permuted copies
        into the up projection, the activation into the down one, and the shared experts'
        activation): the part an fp8 product keeps as a one-byte copy instead."""
        kept = self._routed(n) * (self.hidden + self.ffn)
        if self.shared_ffn:
            kept += n * self.rows * self.shared_ffn
        return float(kept * num.act_bytes)

    def activation_bytes(self, n: int, num: Numerics) -> float:
        """The routed experts' activation output it keeps (the down product's input)."""
        return float(self._routed(n) * self.ffn * num.act_bytes)

    def transient_bytes(self, n: int, num: Numerics) -> float:
        # the routed copies and their up projection alive while the experts run
        e = self._routed(n)
        return float(e * (self.hidden + self._up) * num.act_bytes
                     + 2 * n * self.out_elements * num.act_bytes)


def expected_destinations(units: int, experts: int, top_k: int, reachable: int = 0) -> float:
    """The expected number of distinct units (ranks, or nodes) a token's ``top_k`` experts
    fall in, when ``experts`` spread evenly over ``units`` and the token picks its experts
    at random among those of ``reachable`` units (0: all of them), without repeats."""
    reach = min(reachable or units, units)
    per_unit = experts // units
    pool = reach * per_unit
    if per_unit < 1 or top_k >= pool:
        return float(min(reach, top_k))
    missed = math.comb(pool - per_unit, top_k) / math.comb(pool, top_k)
    return reach * (1.0 - missed)


def ep_collectives(layer: Layer, phase: str, n: int, act: int, dedup_units: int = 0
                   ) -> list[tuple[Collective, float]]:
    """All-to-alls over the expert-parallel group for ``n`` samples: (collective, bytes each
    rank sends and receives). Forward dispatches every token's copies to their experts'
    ranks and combines them back; backward does the same for their gradients.

    A plain all-to-all also exchanges the tokens per expert first (forward), and the
    routing weights where the stack sends them (``dispatches_probs``).

    ``dedup_units``: a dispatcher that sends a token once per destination unit (DeepEP: once
    per rank inside a node, once per node across nodes, forwarded over NVLink there) over
    that many units; the bytes are then the expected distinct destinations, as DeepEP's own
    tests count them. Group-limited routing bounds the nodes a token reaches: ``groups``
    groups over the units, ``groups_per_token`` of them per token."""
    if not isinstance(layer, MoE) or layer.ep == 1:
        return []
    copies = float(layer.top_k)
    if dedup_units > 1:
        reachable = 0
        if layer.groups and layer.groups_per_token:
            reachable = layer.groups_per_token * max(1, dedup_units // layer.groups)
        copies = min(copies, expected_destinations(dedup_units, layer.experts, layer.top_k,
                                                   reachable))
    # the busiest rank receives its load (dispatch) and sends it back
    size = float(layer._routed(n) / layer.top_k * copies * layer.hidden * act)
    if dedup_units > 1:  # DeepEP's kernels carry the weights and the layout themselves
        return [("all_to_all", size), ("all_to_all", size)]
    # Over a plain all-to-all the weights go in one of their own where the stack sends
    # them (fp32, Megatron-LM's token_dispatch), and forward first exchanges every rank's
    # tokens per expert (int64) to size the all-to-alls: Megatron-LM gathers them over the
    # group (MoEAlltoAllTokenDispatcher.preprocess), torchtitan sends them all-to-all
    # (_token_count_exchange); backward has nothing to count.
    probs: list[tuple[Collective, float]] = (
        [("all_to_all", float(layer._routed(n) * DTYPE_BYTES["fp32"]))]
        if layer.dispatches_probs else [])
    if phase == "backward":
        return [("all_to_all", size), *probs, ("all_to_all", size)]
    counts = float(layer.ep * layer.experts * DTYPE_BYTES["int64"])
    return [("all_gather", counts), ("all_to_all", size), *probs, ("all_to_all", size)]
