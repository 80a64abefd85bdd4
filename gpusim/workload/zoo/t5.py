"""T5 encoder-decoders: Raffel et al., "Exploring the Limits of Transfer Learning with a
Unified Text-to-Text Transformer", JMLR 2020 (arXiv 1910.10683), as Hugging Face
transformers builds them (``models/t5/modeling_t5.py``, class names below).

The layout, which decides the parameter count:

* one token table (``shared``) looked up for the encoder's and the decoder's tokens;
* N encoder blocks (``T5Block``): a norm, bidirectional self-attention, a norm, the MLP;
  M decoder blocks: a norm, causal self-attention, a norm, cross-attention whose queries
  come from the decoder and keys and values from the encoder's output (so its key/value
  projection and its attention run over the encoder's length), a norm, the MLP. Each stack
  ends in a norm. No linear layer has a bias;
* the norm (``T5LayerNorm``) is an RMS norm with a weight and no bias or mean;
* positions are a learned bias on the attention scores by relative distance, bucketed
  (``relative_attention_num_buckets``, 32): one table of buckets x heads per stack, held
  by its first block only (``has_relative_attention_bias=bool(i == 0)``). UMT5 gives every
  self-attention its own table. The tables count as parameters; the bias they make is
  added to the scores inside attention, a cost this model leaves out;
* the MLP (``T5DenseActDense`` / ``T5DenseGatedActDense``): ReLU for T5 v1.0, a gated
  GELU (``gated-gelu``: gelu(x W0) * x W1) for T5 v1.1, Flan-T5 and mT5;
* the head: v1.0 ties it to the token table and scales the decoder's output by
  d_model^-0.5 first; v1.1, Flan-T5 and mT5 have a head of their own. The loss is
  cross-entropy over the decoder's tokens.

Lengths: an encoder-decoder reads ``seq_len`` input tokens and predicts
``decoder_seq_len`` target tokens. The decoder length defaults to the encoder's (a
translation or a denoising span task has targets shorter than its inputs; say so with
``decoder_seq_len``, in Python or as a key beside ``hf_config`` in a model YAML). A
sample's tokens (``tokens_per_sample``) are its input tokens, as the T5 paper counts its
pre-training tokens (steps x batch x 512 inputs).

Costed as: the self- and cross-attention cores as fused kernels (SDPA's memory-efficient
kernel takes the position bias as an additive mask; Hugging Face's own T5Attention runs
eagerly), the q, k, v projections of self-attention as one product, dropout where
transformers applies it when the config's ``dropout_rate`` is above 0. Under pipeline
parallelism the encoder's output, which every decoder block reads, is not sent between
stages in this model. Math (unfused) attention, where a stack asks for it, sizes its score
products by the queries alone (``Attention`` in gpusim/workload/attention.py), so a
cross-attention whose decoder is shorter than its encoder is then under-costed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from gpusim.errors import InvalidModel
from gpusim.workload.attention import Attention, CrossEntropy, Embedding
from gpusim.workload.layers import (
    Elementwise,
    Layer,
    Linear,
    dropout,
    gelu,
    relu,
    residual_add,
    rms_norm,
    swiglu,
)
from gpusim.workload.model import InputSpec, Model

Mlp = Literal["relu", "gelu", "gated-gelu", "gated-silu"]
MLPS: tuple[Mlp, ...] = ("relu", "gelu", "gated-gelu", "gated-silu")
DEFAULT_SEQ = 512  # the length T5 was pre-trained at (inputs; n_positions in the configs)


@dataclass(frozen=True)
class T5Config:
    """One encoder-decoder: blocks in each stack, widths (``d_kv`` per head, so the
    attention's inner width is heads x d_kv, not always d_model), the MLP and the head."""

    name: str
    layers: int  # encoder blocks (num_layers)
    decoder_layers: int  # num_decoder_layers
    d_model: int
    d_kv: int
    d_ff: int
    heads: int
    vocab: int = 32128
    mlp: Mlp = "relu"
    tied: bool = True  # the head is the token table (v1.0), scaled by d_model^-0.5
    buckets: int = 32  # relative position buckets (rows of each bias table)
    bias_every_layer: bool = False  # UMT5: a bias table in every self-attention
    seq_len: int = DEFAULT_SEQ  # encoder (input) tokens
    decoder_seq_len: int | None = None  # target tokens; None: the encoder's length
    dropout: bool = True
    description: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        for field in ("layers", "decoder_layers", "d_model", "d_kv", "d_ff", "heads", "vocab",
                      "buckets", "seq_len", "decoder_seq_len"):
            value = getattr(self, field)
            if value is None and field == "decoder_seq_len":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidModel(f"{self.name}: {field} must be a positive integer, "
                                   f"not {value!r}")
        if self.mlp not in MLPS:
            raise InvalidModel(f"{self.name}: MLP {self.mlp!r} is not modelled "
                               f"({', '.join(MLPS)} are)")

    @property
    def inner(self) -> int:
        """The attention's width: heads x d_kv."""
        return self.heads * self.d_kv


def _seq(layer: Elementwise) -> Elementwise:
    """Norms, dropout and residual adds run over the tokens (sequence parallel)."""
    return replace(layer, tp="sequence")


def _residual(cfg: T5Config, prefix: str, rows: int, block: str) -> list[Layer]:
    """A sublayer's output dropped out (when training with dropout) and added back."""
    e = rows * cfg.d_model
    out: list[Layer] = [_seq(dropout(f"{prefix}.dropout", e, block=block))] if cfg.dropout \
        else []
    return [*out, _seq(residual_add(f"{prefix}.add", e, block=block))]


def _mlp(cfg: T5Config, b: str, rows: int) -> list[Layer]:
    """Norm, then wi (two products fused as one for a gated MLP), activation, dropout, wo."""
    gated = cfg.mlp.startswith("gated")
    e = rows * cfg.d_ff
    act = swiglu if gated else gelu if cfg.mlp == "gelu" else relu
    layers: list[Layer] = [
        _seq(rms_norm(f"{b}.mlp.norm", cfg.d_model, rows, block=b)),
        Linear(f"{b}.mlp.wi", cfg.d_model, (2 if gated else 1) * cfg.d_ff, rows, False,
               block=b, tp="column"),
        replace(act(f"{b}.mlp.act", e, block=b), tp="sharded"),
    ]
    if cfg.dropout:
        layers.append(replace(dropout(f"{b}.mlp.act_dropout", e, block=b), tp="sharded"))
    layers.append(Linear(f"{b}.mlp.wo", cfg.d_ff, cfg.d_model, rows, False, block=b,
                         tp="row"))
    return layers + _residual(cfg, f"{b}.mlp", rows, b)


def _self_attention(cfg: T5Config, b: str, rows: int, causal: bool,
                    table: bool) -> list[Layer]:
    """Norm, q/k/v, the core over the stack's own tokens, o; with the stack's relative
    position bias table where this block holds it."""
    layers: list[Layer] = [Embedding(f"{b}.attn.relative_bias", cfg.buckets, cfg.heads, 1,
                                     block=b)] if table else []
    layers += [
        _seq(rms_norm(f"{b}.attn.norm", cfg.d_model, rows, block=b)),
        Linear(f"{b}.attn.qkv", cfg.d_model, 3 * cfg.inner, rows, False, block=b,
               tp="column"),
        Attention(f"{b}.attn.core", cfg.heads, cfg.d_kv, rows, causal=causal,
                  dropout=cfg.dropout, block=b, tp="sharded"),
        Linear(f"{b}.attn.o", cfg.inner, cfg.d_model, rows, False, block=b, tp="row"),
    ]
    return layers + _residual(cfg, f"{b}.attn", rows, b)


def _cross_attention(cfg: T5Config, b: str, dec: int, enc: int) -> list[Layer]:
    """Queries from the decoder's ``dec`` tokens, keys and values projected from the
    encoder's ``enc`` outputs; every query sees every encoder position."""
    return [
        _seq(rms_norm(f"{b}.cross.norm", cfg.d_model, dec, block=b)),
        Linear(f"{b}.cross.q", cfg.d_model, cfg.inner, dec, False, block=b, tp="column"),
        Linear(f"{b}.cross.kv", cfg.d_model, 2 * cfg.inner, enc, False, block=b,
               tp="column"),
        Attention(f"{b}.cross.core", cfg.heads, cfg.d_kv, dec, kv_seq=enc,
                  dropout=cfg.dropout, block=b, tp="sharded"),
        Linear(f"{b}.cross.o", cfg.inner, cfg.d_model, dec, False, block=b, tp="row"),
        *_residual(cfg, f"{b}.cross", dec, b),
    ]


def build_t5(cfg: T5Config, seq_len: int | None = None,
             decoder_seq_len: int | None = None) -> Model:
    """The layers of ``cfg`` for ``seq_len`` input tokens (default the config's) and
    ``decoder_seq_len`` target tokens (default the config's, else the input length)."""
    enc = seq_len or cfg.seq_len
    dec = decoder_seq_len or cfg.decoder_seq_len or enc
    for what, value in (("sequence length", enc), ("decoder sequence length", dec)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InvalidModel(f"{cfg.name}: {what} must be a positive integer, "
                               f"not {value!r}")
    d = cfg.d_model
    # the shared table, looked up once for the inputs and once for the (shifted) targets
    layers: list[Layer] = [Embedding("embed.tokens", cfg.vocab, d, enc + dec, block="embed",
                                     tp="vocab")]
    if cfg.dropout:
        layers.append(_seq(dropout("embed.dropout", (enc + dec) * d, block="embed")))
    for i in range(cfg.layers):
        b = f"encoder.{i}"
        layers += _self_attention(cfg, b, enc, False, i == 0 or cfg.bias_every_layer)
        layers += _mlp(cfg, b, enc)
    last = f"encoder.{cfg.layers - 1}"  # the encoder's final norm, in its last block
    layers.append(_seq(rms_norm("encoder.final_norm", d, enc, block=last)))
    if cfg.dropout:
        layers.append(_seq(dropout("encoder.final_dropout", enc * d, block=last)))
    for i in range(cfg.decoder_layers):
        b = f"decoder.{i}"
        layers += _self_attention(cfg, b, dec, True, i == 0 or cfg.bias_every_layer)
        layers += _cross_attention(cfg, b, dec, enc)
        layers += _mlp(cfg, b, dec)
    layers.append(_seq(rms_norm("final_norm", d, dec, block="head")))
    if cfg.dropout:
        layers.append(_seq(dropout("final_dropout", dec * d, block="head")))
    if cfg.tied:  # sequence_output * d_model**-0.5 before the tied head
        layers.append(Elementwise("head.scale", dec * d, saves=0, bwd_reads=1, block="head",
                                  op="mul", tp="sequence"))
    layers += [Linear("head.vocab", d, cfg.vocab, dec, False, shared=cfg.tied, block="head",
                      tp="vocab", tied_to="embed.tokens" if cfg.tied else ""),
               CrossEntropy("loss", cfg.vocab, dec, block="head", tp="vocab")]
    ids = enc + dec
    tokens = InputSpec(8 * ids, 2e-6 * ids / 1024,
                       "pre-tokenized int64 input and target ids read from memory")
    what = cfg.description or f"T5 encoder-decoder {cfg.name}"
    return Model(cfg.name, tuple(layers), tokens, "transformer", tokens_per_sample=enc,
                 description=f"{what}; {enc} input and {dec} target tokens",
                 source=cfg.source)


__all__ = ["MLPS", "T5Config", "build_t5"]
