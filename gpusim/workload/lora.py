"""LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"):
beside each targeted projection W, a trainable pair A (in x r) and B (r x out) whose product
x A B is added to x W; the base model is frozen.

``add_lora`` returns the model with an adapter after each targeted projection of every body
block. Targets name the projections as the model families name them (q, k, v, o, gate, up,
down); gpusim's fused QKV and gate-up projections take the adapters of their parts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpusim.errors import InvalidConfig
from gpusim.workload.attention import Attention
from gpusim.workload.layers import Elementwise, Layer, Linear
from gpusim.workload.model import Model
from gpusim.workload.numerics import Numerics
from gpusim.workload.ops import GemmShape, Op, gemm_op, memory_op

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
LORA_SUFFIX = ".lora"


@dataclass(frozen=True)
class LoraAdapter(Layer):
    """x -> (dropout(x) A) B, added to the base projection's output. ``dropout`` keeps a
    dropped copy of x and its mask, as PEFT's and LitGPT's lora_dropout does."""

    in_features: int
    out_features: int  # the targeted part of the base projection's output
    rank: int
    rows: int = 1
    dropout: bool = False
    # Adapters side by side on one fused projection (q and v on a fused QKV): each has its
    # own A over the shared input and its own B onto its part of the output.
    parts: int = 1

    @property
    def params(self) -> int:
        return self.rank * (self.parts * self.in_features + self.out_features)

    def tensor_sizes(self) -> list[int]:
        return [self.parts * self.rank * self.in_features, self.rank * self.out_features]

    def factored_sizes(self) -> list[int]:
        return [self.parts * self.rank + self.in_features, self.rank + self.out_features]

    @property
    def _ranks(self) -> int:
        return self.parts * self.rank

    @property
    def out_elements(self) -> int:
        return self.rows * self.out_features

    def _gemm(self, tag: str, m: int, n: int, k: int, num: Numerics) -> Op:
        return gemm_op(f"{self.name}.{tag}", GemmShape(m, n, k), num.matmul, num.act_bytes)

    def forward(self, n: int, num: Numerics) -> list[Op]:
        m = n * self.rows
        ops = []
        if self.dropout:
            x = m * self.in_features
            ops.append(memory_op(f"{self.name}.dropout", x, x, num.act_bytes, mask_written=x))
        ops += [self._gemm("a", m, self._ranks, self.in_features, num),
                self._gemm("b", m, self.out_features, self.rank, num)]
        out = m * self.out_features  # added into the base projection's output
        ops.append(memory_op(f"{self.name}.add", 2 * out, out, num.act_bytes,
                             allocates=False))
        return self._tag(ops)

    def backward_input(self, n: int, num: Numerics) -> list[Op]:
        m = n * self.rows
        x = m * self.in_features
        return self._tag([self._gemm("b_dgrad", m, self._ranks, self.out_features // self.parts,
                                     num),
                          self._gemm("a_dgrad", m, self.in_features, self._ranks, num),
                          memory_op(f"{self.name}.add_grad", 2 * x, x, num.act_bytes,
                                    allocates=False)])

    def backward_weight(self, n: int, num: Numerics) -> list[Op]:
        m = n * self.rows
        return self._tag([self._gemm("b_wgrad", self.out_features, self.rank, m, num),
                          self._gemm("a_wgrad", self._ranks, self.in_features, m, num)])

    def saved_bytes(self, n: int, num: Numerics) -> float:
        """The input A's gradient needs (its dropped copy and mask under dropout), and x A,
        which B's gradient needs."""
        m = n * self.rows
        x = m * self.in_features * (num.act_bytes + (1 if self.dropout else 0))
        return float(x + m * self._ranks * num.act_bytes)

    def transient_bytes(self, n: int, num: Numerics) -> float:
        return 0.0  # its output is added in place into the base projection's


def parse_targets(text: str) -> tuple[str, ...]:
    targets = tuple(t.strip().lower() for t in text.split(",") if t.strip())
    unknown = [t for t in targets if t not in TARGETS]
    if unknown or not targets:
        raise InvalidConfig(f"unknown LoRA target(s) {', '.join(unknown) or '(none)'}; "
                            f"name projections among {', '.join(TARGETS)}")
    return targets


def add_lora(model: Model, rank: int, targets: tuple[str, ...], dropout: bool = False
             ) -> Model:
    """``model`` with a rank-``rank`` adapter beside each targeted projection."""
    if rank < 1:
        raise InvalidConfig(f"--lora-rank must be at least 1 (got {rank})")
    if model.family != "transformer":
        raise InvalidConfig(f"LoRA adapters go on a transformer's projections; {model.name} "
                            f"is a {model.family} model")
    attention = {la.block: la for la in model.layers if isinstance(la, Attention)}
    gated = {la.block for la in model.layers if isinstance(la, Elementwise)
             and la.op == "swiglu"}
    layers: list[Layer] = []
    for layer in model.layers:
        layers.append(layer)
        if not isinstance(layer, Linear) or layer.block not in attention:
            continue
        width, parts = _targeted(layer, attention[layer.block], targets, layer.block in gated)
        if width:
            layers.append(LoraAdapter(f"{layer.name}{LORA_SUFFIX}", layer.in_features, width,
                                      rank, layer.rows, dropout, parts, block=layer.block,
                                      tp="replicated"))
    return replace(model, layers=tuple(layers), name=f"{model.name}+lora{rank}")


def _targeted(layer: Linear, attn: Attention, targets: tuple[str, ...], gated: bool
              ) -> tuple[int, int]:
    """(output features of ``layer`` that the targets adapt, how many adapters they are)."""
    part = layer.name.rsplit(".", 2)[-2:]
    hd, kv = attn.head_dim, attn.kv_heads or attn.heads
    if part == ["attn", "qkv"]:
        widths = {"q": attn.heads * hd, "k": kv * hd, "v": kv * hd}
    elif part == ["attn", "proj"]:
        widths = {"o": layer.out_features}
    elif part == ["mlp", "up"]:  # gate and up side by side when the MLP is gated
        widths = ({"gate": layer.out_features // 2, "up": layer.out_features // 2} if gated
                  else {"up": layer.out_features})
    elif part == ["mlp", "down"]:
        widths = {"down": layer.out_features}
    else:
        return 0, 0
    chosen = [w for t, w in widths.items() if t in targets]
    return sum(chosen), len(chosen)
