"""Transformers from their dimensions: GPT-2/3 and Llama decoders, BERT encoders.

``TransformerConfig`` is also how a user describes a transformer that is not in the zoo, on
the command line (``--model transformer --layers 96 --hidden 12288 ...``) or in YAML.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpusim.workload.attention import Attention, CrossEntropy, Embedding
from gpusim.workload.layers import (
    Conv2d,
    Elementwise,
    Layer,
    Linear,
    TensorSplit,
    dropout,
    gelu,
    layer_norm,
    residual_add,
    rms_norm,
    swiglu,
)
from gpusim.workload.model import InputSpec, Model
from gpusim.workload.moe import MoE
from gpusim.workload.zoo.vision import IMAGENET_INPUT

PosInt = Annotated[int, Field(gt=0)]


class TransformerConfig(BaseModel):
    """Dimensions and flavour of a transformer; defaults describe a GPT-style decoder."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "transformer"
    layers: PosInt
    hidden: PosInt
    heads: PosInt
    kv_heads: PosInt | None = None
    head_dim: PosInt | None = Field(None, description="defaults to hidden / heads")
    ffn_hidden: PosInt | None = Field(None, description="defaults to 4 x hidden")
    vocab: PosInt = 50257
    seq_len: PosInt = 2048
    kind: Literal["decoder", "encoder", "vision"] = "decoder"
    # vision (ViT): the image cut into patch x patch squares, each embedded by a strided
    # convolution, a class token in front; the class token's output is classified
    image_size: PosInt = 224
    patch_size: PosInt = 16
    channels: PosInt = 3
    classes: PosInt = 1000
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    activation: Literal["gelu", "swiglu", "geglu"] = Field(
        "gelu", description="MLP: plain GELU, or gated (SwiGLU's silu(a) * b, GeGLU's "
                            "gelu(a) * b; both costed as the gated product's kernel)")
    # learned: a position table added to the token embedding; rotary: rotary embeddings on
    # the queries and keys in every block; none: no position encoding (NoPE)
    positions: Literal["learned", "rotary", "none"] = "learned"
    max_positions: PosInt | None = Field(None, description="learned position table size")
    # rotary embeddings on this fraction of each head's dimensions (GPT-NeoX and Phi rotate
    # part of the head: rotary_pct, partial_rotary_factor)
    rotary_fraction: float = Field(1.0, gt=0, le=1)
    # queries and keys RMS-normalized per head before the rotary embedding (Qwen3, OLMo 2)
    qk_norm: bool = False
    tied_embeddings: bool = True
    bias: bool = True
    qkv_bias: bool | None = Field(None, description="the q, k, v projection's bias, when it "
                                                   "differs from the other linears' (Qwen2)")
    dropout: bool = False
    # GPT-J, GPT-NeoX, Phi, Falcon: attention and MLP read the same block input, their
    # outputs added to it together (x + attn(norm(x)) + mlp(norm(x))); ``shared_norm``: one
    # norm for both branches (GPT-J, Phi-1/1.5/2, Falcon-7B), else one each (GPT-NeoX)
    parallel_residual: bool = False
    shared_norm: bool = False
    fused_attention: bool = True
    # unfused attention as Hugging Face and NVIDIA wrote BERT's: scores scaled and masked by
    # their own kernels (Attention.scale_and_mask)
    scale_and_mask: bool = False
    # Mixture of experts (gpusim.workload.moe): every block's MLP becomes ``experts`` expert
    # MLPs of ``moe_ffn`` each (default ffn_hidden), ``top_k`` per token, beside shared
    # experts of ``shared_ffn`` in all (0: none)
    experts: int = Field(0, ge=0)
    top_k: PosInt = 2
    moe_ffn: PosInt | None = None
    shared_ffn: int = Field(0, ge=0)
    # Every moe_every-th block has experts, the others a dense MLP of ffn_hidden (Megatron-
    # LM's --moe-layer-freq N, Qwen2-MoE's decoder_sparse_step, Llama 4's
    # interleave_moe_layer_step): block i (from 0) is sparse when (i + 1) % moe_every == 0
    moe_every: PosInt = 1
    dense_layers: int = Field(0, ge=0, description="with experts: the first blocks keep a "
                                                   "dense MLP of ffn_hidden (DeepSeek)")
    # Group-limited routing (DeepSeek-V3's n_group, topk_group): the experts in
    # ``expert_groups`` groups, each token's experts among ``groups_per_token`` of them
    expert_groups: int = Field(0, ge=0)
    groups_per_token: int = Field(0, ge=0)
    # Multi-token prediction (DeepSeek-V3's num_nextn_predict_layers; Megatron-LM's
    # --mtp-num-layers): each depth projects the normalized hidden state and the next
    # token's embedding to one block, runs the block, and predicts through the shared head
    mtp_layers: int = Field(0, ge=0)
    # Multi-head latent attention (DeepSeek-V2/V3): queries through a low-rank projection of
    # q_lora_rank (0: a plain projection), keys and values from one compressed latent of
    # kv_lora_rank plus a shared rotary key; per head qk_nope + qk_rope dimensions for query
    # and key, v_head_dim for the value (head_dim is unused)
    # Sliding-window attention (Mistral, Phi-3, Gemma 2/3, GPT-OSS): blocks attend to the
    # last sliding_window tokens only, except every global_every-th block (0: none global)
    sliding_window: int = Field(0, ge=0)
    global_every: int = Field(0, ge=0)
    kv_lora_rank: int = Field(0, ge=0)
    q_lora_rank: int = Field(0, ge=0)
    qk_nope_head_dim: int = Field(0, ge=0)
    qk_rope_head_dim: int = Field(0, ge=0)
    v_head_dim: int = Field(0, ge=0)
    type_vocab: int = Field(0, ge=0, description="BERT token-type embeddings")
    # Encoders: what the head predicts. "masked_lm" (pre-training) runs the head transform,
    # the vocabulary projection and the loss on every position, or only on the first
    # ``predicted_positions`` of each sequence when given: DeepLearningExamples' BERT
    # gathers the masked tokens first (its default "dense sequence output"; as many as
    # max_predictions_per_seq). "span" is question answering (BertForQuestionAnswering on
    # SQuAD): a start and an end logit per position, each a softmax over the positions.
    head: Literal["masked_lm", "span"] = "masked_lm"
    predicted_positions: int = Field(0, ge=0, description="encoder masked-LM head: "
                                     "positions per sequence it runs on (0: all)")
    description: str = ""
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> TransformerConfig:
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(
                f"hidden {self.hidden} is not divisible by heads {self.heads}; give head_dim"
            )
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        if self.experts and self.top_k > self.experts:
            raise ValueError(f"top_k {self.top_k} is more than the {self.experts} experts")
        if self.kind != "encoder" and (self.head != "masked_lm" or self.predicted_positions):
            raise ValueError("head and predicted_positions describe an encoder's head "
                             f"(kind: encoder), not a {self.kind}'s")
        return self

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden


def _split(layer: Layer, tp: TensorSplit) -> Layer:
    return replace(layer, tp=tp)


def _mla(cfg: TransformerConfig, b: str, s: int, norm: Callable[..., Layer]) -> list[Layer]:
    """Multi-head latent attention as DeepSeek-V2/V3 train it: the latent and the shared
    rotary key from one down-projection, each head's key and value up-projected from the
    latent, queries through their own low-rank pair. The core runs on every head; its cost
    is a fused kernel's at the mean of the query/key and value head sizes (the products are
    s x s x d_qk and s x s x d_v)."""
    h, heads = cfg.hidden, cfg.heads
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    query: list[Layer]
    if cfg.q_lora_rank:
        query = [Linear(f"{b}.attn.q_down", h, cfg.q_lora_rank, s, False, block=b),
                 norm(f"{b}.attn.q_norm", cfg.q_lora_rank, s, block=b),
                 Linear(f"{b}.attn.q_up", cfg.q_lora_rank, heads * qk, s, False, block=b,
                        tp="column")]
    else:
        query = [Linear(f"{b}.attn.q", h, heads * qk, s, False, block=b, tp="column")]
    return [
        *query,
        Linear(f"{b}.attn.kv_down", h, cfg.kv_lora_rank + cfg.qk_rope_head_dim, s, False,
               block=b),
        norm(f"{b}.attn.kv_norm", cfg.kv_lora_rank, s, block=b),
        Linear(f"{b}.attn.kv_up", cfg.kv_lora_rank,
               heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), s, False, block=b, tp="column"),
        Attention(f"{b}.attn.core", heads, (qk + cfg.v_head_dim) // 2, s, heads,
                  causal=True, fused=cfg.fused_attention, block=b, tp="sharded",
                  rotary_dim=cfg.qk_rope_head_dim, rotary_shared_key=True),
        Linear(f"{b}.attn.proj", heads * cfg.v_head_dim, h, s, False, block=b, tp="row"),
    ]


def build_transformer(cfg: TransformerConfig, seq_len: int | None = None) -> Model:
    """The layer list of ``cfg`` at sequence length ``seq_len`` (default: the config's),
    each layer marked with how Megatron-style tensor parallelism splits it."""
    s = seq_len or cfg.seq_len
    h, kv, hd = cfg.hidden, cfg.kv_heads or cfg.heads, cfg.dim_head
    norm = rms_norm if cfg.norm == "rmsnorm" else layer_norm
    vision = cfg.kind == "vision"
    layers: list[Layer]
    if vision:
        side = cfg.image_size // cfg.patch_size
        s = side * side + 1  # the patches and the class token
        layers = [Conv2d("embed.patches", cfg.channels, h, cfg.patch_size, cfg.image_size,
                         cfg.image_size, stride=cfg.patch_size, bias=True, block="embed"),
                  Embedding("embed.class_token", 1, h, 1, block="embed")]
    else:
        layers = [Embedding("embed.tokens", cfg.vocab, h, s, block="embed", tp="vocab")]
    if cfg.positions == "learned":
        table = s if vision else cfg.max_positions or s
        layers.append(Embedding("embed.positions", table, h, s, block="embed"))
    if cfg.type_vocab:
        layers.append(Embedding("embed.types", cfg.type_vocab, h, s, block="embed"))
    if cfg.kind == "encoder":
        layers.append(_split(norm("embed.norm", h, s, block="embed"), "sequence"))
    if cfg.dropout:
        layers.append(_split(dropout("embed.dropout", s * h, block="embed"), "sequence"))

    rotary_dim = round(hd * cfg.rotary_fraction) if cfg.positions == "rotary" else 0
    for i in range(cfg.layers):
        b = f"h.{i}"
        # GPT, Llama and ViT normalize before each sublayer, BERT after
        pre = cfg.kind != "encoder"
        attn: list[Layer] = _mla(cfg, b, s, norm) if cfg.kv_lora_rank else [
            Linear(f"{b}.attn.qkv", h, (cfg.heads + 2 * kv) * hd, s,
                   cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias, block=b, tp="column"),
            Attention(f"{b}.attn.core", cfg.heads, hd, s, kv, causal=cfg.kind == "decoder",
                      fused=cfg.fused_attention, dropout=cfg.dropout, block=b, tp="sharded",
                      scale_and_mask=cfg.scale_and_mask and not cfg.fused_attention,
                      rotary_dim=rotary_dim, qk_norm=cfg.qk_norm),
            Linear(f"{b}.attn.proj", cfg.heads * hd, h, s, cfg.bias, block=b, tp="row"),
        ]
        if cfg.sliding_window and not (cfg.global_every and (i + 1) % cfg.global_every == 0):
            attn = [replace(la, window=cfg.sliding_window) if isinstance(la, Attention) else la
                    for la in attn]
        if cfg.dropout:
            attn.append(_split(dropout(f"{b}.attn.dropout", s * h, block=b), "sequence"))
        if not cfg.parallel_residual:
            attn.append(_split(residual_add(f"{b}.attn.add", s * h, block=b), "sequence"))
        gated = cfg.activation in ("swiglu", "geglu")
        up = 2 * cfg.ffn if gated else cfg.ffn
        act = swiglu if gated else gelu
        mlp: list[Layer] = [
            Linear(f"{b}.mlp.up", h, up, s, cfg.bias, block=b, tp="column"),
            _split(act(f"{b}.mlp.act", s * cfg.ffn, block=b), "sharded"),
            Linear(f"{b}.mlp.down", cfg.ffn, h, s, cfg.bias, block=b, tp="row"),
        ]
        if cfg.experts and i >= cfg.dense_layers and (i + 1) % cfg.moe_every == 0:
            mlp = [MoE(f"{b}.moe", h, cfg.moe_ffn or cfg.ffn, cfg.experts, cfg.top_k, s,
                       gated=gated, shared_ffn=cfg.shared_ffn, block=b, tp="sharded",
                       groups=cfg.expert_groups, groups_per_token=cfg.groups_per_token)]
        if cfg.dropout:
            mlp.append(_split(dropout(f"{b}.mlp.dropout", s * h, block=b), "sequence"))
        norm1 = _split(norm(f"{b}.norm1", h, s, block=b), "sequence")
        norm2 = _split(norm(f"{b}.norm2", h, s, block=b), "sequence")
        if cfg.parallel_residual:
            if cfg.shared_norm and isinstance(mlp[0], Linear):
                # the MLP's first product reads the tensor attention's already keeps
                mlp[0] = replace(mlp[0], input_kept=True)
            both = _split(residual_add(f"{b}.add", s * h, block=b, branches=2), "sequence")
            layers += [norm1, *attn, *([] if cfg.shared_norm else [norm2]), *mlp, both]
            continue
        mlp.append(_split(residual_add(f"{b}.mlp.add", s * h, block=b), "sequence"))
        layers += [norm1, *attn, norm2, *mlp] if pre else [*attn, norm1, *mlp, norm2]

    if vision:  # the class token's output, normalized and classified
        layers += [_split(norm("final_norm", h, s, block="head"), "sequence"),
                   Linear("head.classes", h, cfg.classes, 1, True, block="head"),
                   CrossEntropy("loss", cfg.classes, 1, block="head")]
        pixels = InputSpec(cfg.channels * cfg.image_size**2, IMAGENET_INPUT.loader_cpu_s,
                           f"ImageNet JPEG, decoded and cropped to {cfg.image_size}x"
                           f"{cfg.image_size} uint8")
        return Model(cfg.name, tuple(layers), pixels, "transformer", tokens_per_sample=0,
                     description=cfg.description, source=cfg.source)
    if cfg.kind == "decoder":
        layers.append(_split(norm("final_norm", h, s, block="head"), "sequence"))
    elif cfg.head == "span":  # a start and an end logit per position, each over the positions
        layers += [Linear("head.span", h, 2, s, True, block="head"),
                   CrossEntropy("loss", s, 2, block="head")]
        return _language_model(cfg, layers, s)
    else:  # BERT's masked-LM head transform
        layers += _masked_lm_rows(cfg, s, norm)
    rows = _predicted_rows(cfg, s)
    layers.append(Linear("head.vocab", h, cfg.vocab, rows, bias=cfg.kind == "encoder",
                         shared=cfg.tied_embeddings, block="head", tp="vocab",
                         tied_to="embed.tokens" if cfg.tied_embeddings else ""))
    layers.append(CrossEntropy("loss", cfg.vocab, rows, block="head", tp="vocab"))
    if cfg.mtp_layers and cfg.kind == "decoder":
        layers += _mtp_layers(cfg, s, rows, norm)
    return _language_model(cfg, layers, s)


def _mtp_layers(cfg: TransformerConfig, s: int, rows: int,
                norm: Callable[..., Layer]) -> list[Layer]:
    """Multi-token prediction's layers, after the loss, in the head's part of the model
    (the last pipeline stage; DeepSeek-V3 Technical Report section 2.2, Megatron-LM's
    multi_token_prediction.py): per depth, the hidden state and the embedding of the tokens
    one further on each normalized, concatenated and projected back to the hidden size
    (eh_proj), one more block as the body's next one would be, a norm, the shared output
    head and a loss. The embedding lookup, a gather of the shared table, is left out."""
    h = cfg.hidden
    longer = build_transformer(cfg.model_copy(update={"layers": cfg.layers + cfg.mtp_layers,
                                                      "mtp_layers": 0}), s)
    out: list[Layer] = []
    for k in range(cfg.mtp_layers):
        b, m = f"h.{cfg.layers + k}", f"mtp.{k}"
        block = [replace(la, name=m + la.name[len(b):], block="head")
                 for la in longer.layers if la.block == b]
        out += [_split(norm(f"{m}.enorm", h, s, block="head"), "sequence"),
                _split(norm(f"{m}.hnorm", h, s, block="head"), "sequence"),
                Linear(f"{m}.proj", 2 * h, h, s, False, block="head", tp="column"),
                *block,
                _split(norm(f"{m}.final_norm", h, s, block="head"), "sequence"),
                Linear(f"{m}.head", h, cfg.vocab, rows, bias=False, shared=True, block="head",
                       tp="vocab", tied_to="head.vocab"),
                CrossEntropy(f"{m}.loss", cfg.vocab, rows, block="head", tp="vocab")]
    return out


def _predicted_rows(cfg: TransformerConfig, s: int) -> int:
    """Positions of each sequence the language-model head runs on (a sequence shorter than
    ``predicted_positions`` has no more to predict)."""
    return min(cfg.predicted_positions or s, s)


def _masked_lm_rows(cfg: TransformerConfig, s: int, norm: Callable[..., Layer]) -> list[Layer]:
    """The masked-LM head transform (dense, GELU, norm) over every position, or over the
    ``predicted_positions`` an index_select gathers first. The gather's backward writes a
    zero-filled gradient of the whole sequence output, then adds the gathered rows' into it."""
    h = cfg.hidden
    rows = _predicted_rows(cfg, s)
    gather: list[Layer] = []
    if rows < s:
        gather = [Elementwise("head.gather", rows * h, bwd_reads=1, bwd_writes=(s + rows) / rows,
                              saves=0, flops_per_element=0, block="head", op="gather")]
    return [*gather,
            Linear("head.transform", h, h, rows, True, block="head"),
            gelu("head.act", rows * h, block="head"),
            norm("head.norm", h, rows, block="head")]


def _language_model(cfg: TransformerConfig, layers: list[Layer], s: int) -> Model:
    tokens = InputSpec(8 * s, 2e-6 * s / 1024, "pre-tokenized int64 ids read from memory")
    return Model(cfg.name, tuple(layers), tokens, "transformer", tokens_per_sample=s,
                 description=cfg.description, source=cfg.source)


_GPT2 = "Radford et al. 2019 (GPT-2); Hugging Face gpt2 configs"
_GPT3 = "Brown et al. 2020, Table 2.1"


def _gpt2(name: str, layers: int, hidden: int, heads: int, size: str) -> TransformerConfig:
    return TransformerConfig(name=name, layers=layers, hidden=hidden, heads=heads,
                             vocab=50257, seq_len=1024, max_positions=1024, dropout=True,
                             description=f"GPT-2 {size}", source=_GPT2)


def _gpt3(name: str, layers: int, hidden: int, heads: int, size: str) -> TransformerConfig:
    return TransformerConfig(name=name, layers=layers, hidden=hidden, heads=heads,
                             vocab=50257, seq_len=2048, max_positions=2048,
                             description=f"GPT-3 {size}", source=_GPT3)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int,
           seq: int, size: str, source: str) -> TransformerConfig:
    return TransformerConfig(name=name, layers=layers, hidden=hidden, heads=heads,
                             kv_heads=kv, ffn_hidden=ffn, vocab=vocab, seq_len=seq,
                             norm="rmsnorm", activation="swiglu", positions="rotary",
                             tied_embeddings=False, bias=False, description=size,
                             source=source)


def _bert(name: str, layers: int, hidden: int, heads: int, size: str) -> TransformerConfig:
    return TransformerConfig(name=name, layers=layers, hidden=hidden, heads=heads,
                             vocab=30522, seq_len=512, max_positions=512, type_vocab=2,
                             kind="encoder", dropout=True, fused_attention=False,
                             description=size,
                             source="Devlin et al. 2019; google-research/bert configs")


_VIT = ("Dosovitskiy et al. 2021 (ViT), Table 1; torchvision models docs: vit_b_16 86.6M "
        "parameters and 17.56 GFLOPS (multiply-adds), vit_l_16 304.3M and 61.55")


def _vit(name: str, layers: int, hidden: int, heads: int, mlp: int, patch: int,
         size: str) -> TransformerConfig:
    return TransformerConfig(name=name, layers=layers, hidden=hidden, heads=heads,
                             ffn_hidden=mlp, kind="vision", patch_size=patch,
                             tied_embeddings=False, description=size, source=_VIT)


TRANSFORMERS: dict[str, TransformerConfig] = {
    c.name: c
    for c in [
        _bert("bert-base", 12, 768, 12, "BERT-base (110M)"),
        _bert("bert-large", 24, 1024, 16, "BERT-large (340M)"),
        _gpt2("gpt2", 12, 768, 12, "small (124M)"),
        _gpt2("gpt2-medium", 24, 1024, 16, "medium (355M)"),
        _gpt2("gpt2-large", 36, 1280, 20, "large (774M)"),
        _gpt2("gpt2-xl", 48, 1600, 25, "XL (1.5B)"),
        _gpt3("gpt3-125m", 12, 768, 12, "Small (125M)"),
        _gpt3("gpt3-350m", 24, 1024, 16, "Medium (350M)"),
        _gpt3("gpt3-760m", 24, 1536, 16, "Large (760M)"),
        # The paper lists 24 heads of 128 for d_model 2048, which does not multiply out;
        # 16 heads of 128 keeps the parameter count and FLOPs of the published model.
        _gpt3("gpt3-1.3b", 24, 2048, 16, "XL (1.3B)"),
        _gpt3("gpt3-2.7b", 32, 2560, 32, "2.7B"),
        _gpt3("gpt3-6.7b", 32, 4096, 32, "6.7B"),
        _gpt3("gpt3-13b", 40, 5120, 40, "13B"),
        _gpt3("gpt3-175b", 96, 12288, 96, "175B"),
        _vit("vit-b16", 12, 768, 12, 3072, 16, "ViT-B/16 (86M), 224x224 images"),
        _vit("vit-l16", 24, 1024, 16, 4096, 16, "ViT-L/16 (304M), 224x224 images"),
        _vit("vit-h14", 32, 1280, 16, 5120, 14, "ViT-H/14 (632M), 224x224 images"),
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, "Llama 2 7B",
               "Touvron et al. 2023 (Llama 2); meta-llama/Llama-2-7b-hf config.json"),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, "Llama 3 8B",
               "Meta Llama 3 model card; meta-llama/Meta-Llama-3-8B config.json"),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, "Llama 3 70B",
               "Meta Llama 3 model card; meta-llama/Meta-Llama-3-70B config.json"),
    ]
}
