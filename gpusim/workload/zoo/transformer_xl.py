"""Transformer-XL (Dai et al. 2019, arXiv 1901.02860) as NVIDIA DeepLearningExamples trains
it on WikiText-103: ``PyTorch/LanguageModeling/Transformer-XL/pytorch`` at commit 729963dd4
(``mem_transformer.py``: MemTransformerLM, RelPartialLearnableMultiHeadAttn,
PositionwiseFF, AdaptiveEmbedding; ``utils/proj_adaptive_softmax.py``; the dimensions in
``wt103_base.yaml`` and ``wt103_large.yaml``, whose ``manual_config`` lines spell out every
constructor argument). Paths below are relative to that folder.

A sample is one segment of ``tgt_len`` new tokens (``tokens_per_sample``); each block also
attends over ``mem_len`` hidden states cached from the previous segment, so the keys run
over ``klen = mem_len + tgt_len`` positions. Layers, per block (``pre_lnorm`` False, the
post-norm default):

* ``cat = torch.cat([mems, w], 0)``, then ``qkv_net(cat)``: queries, keys and values are
  projected for all klen rows, the memory's queries computed and dropped
  (``w_head_q[-qlen:]``). The memory is detached, but it is multiplied by this segment's
  ``qkv_net`` weight, so the weight gradient sums over all klen rows, and autograd computes
  the input gradient of the whole ``cat`` before CatBackward drops the memory's part: a
  ``Linear`` over klen rows is what runs, forward and backward. The concatenation is a copy
  with no backward kernel (CatBackward slices views).
* ``r_net`` projects the klen sinusoidal position embeddings (``pos_emb[:, None, :]``, one
  set for the whole batch): its rows do not grow with the batch, and its input needs no
  gradient (``PositionProjection``).
* the core (``RelPartialAttention``): AC = (q + r_w_bias) K^T over klen keys and
  BD = (q + r_r_bias) R^T against the klen positions, a second batched product; BD is
  shifted by ``_rel_shift`` (a padded copy, then views); scores = (AC + BD) x scale (one
  TorchScript kernel, ``add_and_scale``), the causal mask filled in place, softmax over
  klen, dropout of the probabilities when ``dropatt`` > 0 (p = 0 is a no-op in ATen), the
  product with V, and the heads merged by ``.contiguous()``. Written with einsum: the
  strided K and V chunks of ``w_heads`` are copied into batched layout first.
* ``o_net``, dropout, the residual add, LayerNorm; the position-wise FF: Linear, ReLU (in
  place), dropout, Linear, dropout, the residual add, LayerNorm.

Around the blocks: the word embedding times sqrt(d_model) (``AdaptiveEmbedding``; with
``div_val`` > 1 one table and projection per frequency cluster), dropout; after them
dropout, the memory for the next segment (``torch.stack(hids)``), and the projected
adaptive softmax (``AdaptiveSoftmax`` below) with the cutoffs of ``train.py`` for wt103.

What this leaves out: the sinusoidal position table and the causal mask (a few kernels of
klen x d_model once per forward), the scalar loss mean, the host synchronisation each
cluster's ``nonzero()`` forces (four per forward), and DistributedDataParallel's
``find_unused_parameters`` traversal. Tensor, pipeline and context parallelism are not
modelled for these layers (DeepLearningExamples trains with data parallelism only).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

from gpusim.errors import InvalidModel
from gpusim.workload.attention import UNFUSED_ATTENTION, Embedding
from gpusim.workload.layers import (
    Elementwise,
    Layer,
    Linear,
    dropout,
    layer_norm,
    residual_add,
)
from gpusim.workload.model import InputSpec, Model
from gpusim.workload.numerics import Numerics
from gpusim.workload.ops import DTYPE_BYTES, GemmShape, Op, gemm_op, memory_op
from gpusim.workload.zoo.txl_softmax import AdaptiveEmbedding, AdaptiveSoftmax, zipf_fractions

_DLE = ("NVIDIA/DeepLearningExamples @729963dd4 PyTorch/LanguageModeling/Transformer-XL/"
        "pytorch: mem_transformer.py, utils/proj_adaptive_softmax.py, train.py (cutoffs "
        "19997/39997/199997 and tie_projs for wt103)")
WT103_VOCAB = 267735  # wt103_base.yaml manual_config n_token
WT103_CUTOFFS = (19997, 39997, 199997)  # train.py, args.dataset == 'wt103'


@dataclass(frozen=True)
class PositionProjection(Linear):
    """``r_net``: a projection of the klen relative positions, shared by every sample of the
    batch (``rows`` is per batch, not per sample). Its input, the sinusoidal table, needs no
    gradient."""

    def forward(self, n: int, num: Numerics) -> list[Op]:
        return super().forward(1, num)

    def backward_input(self, n: int, num: Numerics) -> list[Op]:
        return []

    def backward_weight(self, n: int, num: Numerics) -> list[Op]:
        return super().backward_weight(1, num)

    def saved_bytes(self, n: int, num: Numerics) -> float:
        return super().saved_bytes(1, num)


@dataclass(frozen=True)
class RelPartialAttention(Layer):
    """The attention core of ``RelPartialLearnableMultiHeadAttn.forward`` after the
    projections: ``seq`` queries (tgt_len) against ``seq + mem`` keys, costed kernel by
    kernel as the eager einsum code runs them (module docstring). ``bias_params``: the
    model's shared ``r_w_bias`` and ``r_r_bias``, held by the first block's core."""

    heads: int
    head_dim: int
    seq: int
    mem: int
    dropout: bool = False
    bias_params: int = 0

    @property
    def keys(self) -> int:
        return self.seq + self.mem

    @property
    def params(self) -> int:
        return self.bias_params

    def tensor_sizes(self) -> list[int]:
        return [self.bias_params // 2] * 2 if self.bias_params else []

    @property
    def out_elements(self) -> int:
        return self.seq * self.heads * self.head_dim

    def _sizes(self, n: int) -> tuple[float, float, float]:
        """Elements of the scores (S), the queries (Q) and the keys or values (K)."""
        hd = self.heads * self.head_dim
        return (float(n * self.heads * self.seq * self.keys), float(n * self.seq * hd),
                float(n * self.keys * hd))

    def _gemms(self, n: int, num: Numerics, names: tuple[str, ...]) -> list[Op]:
        q, k, d, h = self.seq, self.keys, self.head_dim, self.heads
        b = n * h
        shapes = {
            # AC and its gradients: one (q x k) score matrix per sample and head
            "ac": GemmShape(q, k, d, b), "dq_ac": GemmShape(q, d, k, b),
            "dk": GemmShape(k, d, q, b),
            # BD: r_head_k is shared by the batch, so einsum runs one product per head
            # with the batch's queries stacked (ibnd,jnd->bnij)
            "bd": GemmShape(n * q, k, d, h), "dq_bd": GemmShape(n * q, d, k, h),
            "dr": GemmShape(k, d, n * q, h),
            # the probabilities times V, and its gradients
            "av": GemmShape(q, d, k, b), "dprob": GemmShape(q, k, d, b),
            "dv": GemmShape(k, d, q, b),
        }
        return [replace(gemm_op(f"{self.name}.{key}", shapes[key], num.matmul, num.act_bytes),
                        family=UNFUSED_ATTENTION)
                for key in names]

    def _copy(self, name: str, read: float, written: float, num: Numerics,
              flops: float = 0.0, *, allocates: bool = True, mask_read: float = 0.0,
              mask_written: float = 0.0) -> Op:
        """A memory-bound kernel over activation-typed elements."""
        return memory_op(f"{self.name}.{name}", read, written, num.act_bytes, flops,
                         allocates=allocates, mask_read=mask_read, mask_written=mask_written)

    def forward(self, n: int, num: Numerics) -> list[Op]:
        s, qe, ke = self._sizes(n)
        pad = float(n * self.heads * self.seq)  # the zero column _rel_shift prepends
        ops = [self._copy("q_plus_r_w_bias", qe, qe, num, 1.0),
               self._copy("q_plus_r_r_bias", qe, qe, num, 1.0),
               self._copy("k_layout", ke, ke, num),
               *self._gemms(n, num, ("ac", "bd")),
               self._copy("rel_shift_pad", s, s + pad, num),
               self._copy("add_and_scale", 2 * s, s, num, 2.0),
               self._copy("mask_fill", s, s, num, allocates=False)]
        ops.append(memory_op(f"{self.name}.softmax", s, s, num.softmax_bytes, 5.0,
                             family=UNFUSED_ATTENTION))
        if self.dropout:
            ops.append(self._copy("dropatt", s, s, num, mask_written=s))
        ops += [self._copy("v_layout", ke, ke, num), *self._gemms(n, num, ("av",)),
                self._copy("merge_heads", qe, qe, num)]
        return self._tag(ops)

    def backward_input(self, n: int, num: Numerics) -> list[Op]:
        s, qe, ke = self._sizes(n)
        hd = float(self.heads * self.head_dim)
        ops = self._gemms(n, num, ("dprob", "dv"))
        if self.dropout:
            ops.append(self._copy("dropatt_bwd", s, s, num, mask_read=s))
        ops += [
            memory_op(f"{self.name}.softmax_bwd", 2 * s, s, num.softmax_bytes, 3.0,
                      family=UNFUSED_ATTENTION),
            self._copy("mask_fill_bwd", s, s, num),
            self._copy("add_and_scale_bwd", s, s, num, 1.0),
            # narrow's backward: a zero-filled padded gradient with the slice copied in;
            # the strided slice is then copied again into the BD product's batched layout
            self._copy("rel_shift_zero", 0, s, num),
            self._copy("rel_shift_bwd", s, s, num),
            self._copy("bd_grad_layout", s, s, num),
            *self._gemms(n, num, ("dq_bd", "dr", "dq_ac", "dk")),
            self._copy("dq_sum", 2 * qe, qe, num, 1.0),
            # r_w_bias and r_r_bias: every block's use sums its query gradient
            self._copy("r_w_bias_grad", qe, hd, num),
            self._copy("r_r_bias_grad", qe, hd, num),
            # dq, dk, dv back to (klen, batch, heads x dim), the memory's query rows
            # zero-filled (w_head_q[-qlen:]'s backward), then chunk's backward packs them
            self._copy("dqkv_layout", qe + 2 * ke, qe + 2 * ke, num),
            self._copy("dqkv_pack", qe + 2 * ke, 4 * ke, num),
        ]
        return self._tag(ops)

    def saved_bytes(self, n: int, num: Numerics) -> float:
        """The biased queries of both products, the K and V copies, the softmax output (the
        AV product's input), and with dropout its mask and the dropped probabilities."""
        s, qe, ke = self._sizes(n)
        kept = (2 * qe + 2 * ke) * num.act_bytes + s * num.softmax_bytes
        if self.dropout:
            kept += s * (1 + num.act_bytes)
        return kept

    def transient_bytes(self, n: int, num: Numerics) -> float:
        """AC, the padded BD and the scores are alive together."""
        return 3.0 * self._sizes(n)[0] * num.act_bytes


@dataclass(frozen=True)
class TransformerXLConfig:
    """One MemTransformerLM with adaptive embedding and softmax (attn_type 0). ``fractions``:
    the share of tokens in each frequency cluster (head first); None takes Zipf's law over
    the frequency-ranked vocabulary (txl_softmax.zipf_fractions, where its source and its
    bias are stated)."""

    name: str
    layers: int
    d_model: int
    heads: int
    d_head: int
    d_inner: int
    tgt_len: int
    mem_len: int
    vocab: int = WT103_VOCAB
    cutoffs: tuple[int, ...] = WT103_CUTOFFS
    div_val: int = 1
    d_embed: int = 0  # 0: d_model (train.py: d_embed < 0 means d_model)
    dropout: float = 0.1
    dropatt: float = 0.0
    fractions: tuple[float, ...] | None = None
    description: str = ""
    source: str = field(default=_DLE)

    def __post_init__(self) -> None:
        for name in ("layers", "d_model", "heads", "d_head", "d_inner", "tgt_len", "vocab",
                     "div_val"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidModel(f"{self.name}: {name} must be a positive integer, "
                                   f"not {value!r}")
        if self.mem_len < 0:
            raise InvalidModel(f"{self.name}: mem_len must be 0 or more, not {self.mem_len}")
        ends = (0, *self.cutoffs, self.vocab)
        if any(b <= a for a, b in itertools.pairwise(ends)):
            raise InvalidModel(f"{self.name}: cutoffs {self.cutoffs} must rise strictly "
                               f"below the vocabulary of {self.vocab}")
        if self.fractions is not None and (len(self.fractions) != len(self.cutoffs) + 1
                                           or not math.isclose(sum(self.fractions), 1.0)):
            raise InvalidModel(f"{self.name}: fractions need one share per cluster "
                               f"({len(self.cutoffs) + 1}) summing to 1")

    @property
    def embed_dim(self) -> int:
        return self.d_embed or self.d_model


def _seq(layer: Elementwise) -> Elementwise:
    return replace(layer, tp="sequence")


def _block(cfg: TransformerXLConfig, i: int, q: int) -> list[Layer]:
    b = f"layers.{i}"
    d, hd, k = cfg.d_model, cfg.heads * cfg.d_head, q + cfg.mem_len
    drop = cfg.dropout > 0
    layers: list[Layer] = [
        Elementwise(f"{b}.attn.cat_mems", k * d, saves=0, has_backward_kernel=False,
                    flops_per_element=0, op="cat", block=b),
        Linear(f"{b}.attn.qkv", d, 3 * hd, k, False, block=b),
        PositionProjection(f"{b}.attn.r_net", d, hd, k, False, block=b),
        RelPartialAttention(f"{b}.attn.core", cfg.heads, cfg.d_head, q, cfg.mem_len,
                            dropout=cfg.dropatt > 0, bias_params=2 * hd if i == 0 else 0,
                            block=b),
        Linear(f"{b}.attn.o", hd, d, q, False, block=b),
    ]
    if drop:
        layers.append(_seq(dropout(f"{b}.attn.dropout", q * d, block=b)))
    layers += [_seq(residual_add(f"{b}.attn.add", q * d, block=b)),
               _seq(layer_norm(f"{b}.attn.norm", d, q, block=b)),
               Linear(f"{b}.ff.up", d, cfg.d_inner, q, True, block=b),
               # nn.ReLU(inplace=True): writes over the product, and keeps it for its
               # backward (the dropout after it keeps only a mask)
               Elementwise(f"{b}.ff.relu", q * cfg.d_inner, saves=1, op="relu",
                           inplace=True, block=b)]
    if drop:
        layers.append(dropout(f"{b}.ff.act_dropout", q * cfg.d_inner, block=b))
    layers.append(Linear(f"{b}.ff.down", cfg.d_inner, d, q, True, block=b))
    if drop:
        layers.append(_seq(dropout(f"{b}.ff.dropout", q * d, block=b)))
    return [*layers, _seq(residual_add(f"{b}.ff.add", q * d, block=b)),
            _seq(layer_norm(f"{b}.ff.norm", d, q, block=b))]


def build_transformer_xl(cfg: TransformerXLConfig, tgt_len: int | None = None) -> Model:
    """The layers of ``cfg`` for segments of ``tgt_len`` tokens (default the config's)."""
    q = tgt_len or cfg.tgt_len
    if isinstance(q, bool) or not isinstance(q, int) or q <= 0:
        raise InvalidModel(f"{cfg.name}: tgt_len must be a positive integer, not {q!r}")
    d, e = cfg.d_model, cfg.embed_dim
    fractions = cfg.fractions or zipf_fractions(cfg.vocab, cfg.cutoffs)
    adaptive_input = cfg.div_val > 1 or e != d
    layers: list[Layer] = [
        AdaptiveEmbedding("embed.word", cfg.vocab, e, d, cfg.cutoffs, cfg.div_val, q,
                          fractions, block="embed") if adaptive_input
        else Embedding("embed.word", cfg.vocab, d, q, block="embed"),
        # embed.mul_(emb_scale): in place; its backward scales the gradient
        Elementwise("embed.scale", q * d, saves=0, bwd_reads=1, op="mul", inplace=True,
                    block="embed"),
    ]
    if cfg.dropout > 0:
        layers.append(_seq(dropout("embed.dropout", q * d, block="embed")))
    for i in range(cfg.layers):
        layers += _block(cfg, i, q)
    if cfg.dropout > 0:
        layers.append(_seq(dropout("head.dropout", q * d, block="head")))
    if cfg.mem_len:  # _update_mems: torch.stack(hids) under no_grad, kept for the next step
        layers.append(Elementwise("head.update_mems", cfg.layers * q * d, saves=0,
                                  has_backward_kernel=False, flops_per_element=0,
                                  op="stack", block="head"))
    layers.append(AdaptiveSoftmax("head.adaptive_softmax", cfg.vocab, e, d, cfg.cutoffs,
                                  cfg.div_val, q, fractions, block="head"))
    # data and target: int64 ids of the segment, copied to the device per step
    tokens = InputSpec(2 * DTYPE_BYTES["int64"] * q, 2e-6 * q / 1024,
                       "pre-tokenized int64 ids and targets read from memory")
    what = cfg.description or f"Transformer-XL {cfg.name}"
    return Model(cfg.name, tuple(layers), tokens, "transformer", tokens_per_sample=q,
                 description=f"{what}; {q} new tokens a segment, {cfg.mem_len} remembered",
                 source=cfg.source)


_BASE = ("wt103_base.yaml @729963dd4 (train and manual_config: n_layer 16, d_model 512, "
         "n_head 8, d_head 64, d_inner 2048, dropout 0.1, dropatt 0.0, tgt_len = mem_len = "
         "192, div_val 1, n_token 267735); README 'Model architecture' table; ")
_LARGE = ("wt103_large.yaml @729963dd4 (train and manual_config: n_layer 18, d_model 1024, "
          "n_head 16, d_head 64, d_inner 4096, dropout 0.2, dropatt 0.2, tgt_len = mem_len "
          "= 384, div_val 4, n_token 267735); ")

TRANSFORMER_XLS: dict[str, TransformerXLConfig] = {
    c.name: c for c in [
        TransformerXLConfig("transformer-xl-base", 16, 512, 8, 64, 2048, 192, 192,
                            description="Transformer-XL base (WikiText-103, "
                                        "DeepLearningExamples)", source=_BASE + _DLE),
        TransformerXLConfig("transformer-xl-large", 18, 1024, 16, 64, 4096, 384, 384,
                            div_val=4, dropout=0.2, dropatt=0.2,
                            description="Transformer-XL large (WikiText-103, "
                                        "DeepLearningExamples)", source=_LARGE + _DLE),
    ]
}

__all__ = ["TRANSFORMER_XLS", "PositionProjection", "RelPartialAttention",
           "TransformerXLConfig", "build_transformer_xl"]
