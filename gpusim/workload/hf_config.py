"""Hugging Face transformers configs (a model repository's ``config.json``) as gpusim
transformers.

Each supported ``model_type`` maps its fields onto ``TransformerConfig``: the dimensions,
the norm, the MLP (plain or gated, and its activation), the positions, the biases and
whether the head is tied to the embedding. What a family has that gpusim does not model
(Qwen3's per-head q/k norms, Gemma 2's extra norms and soft-capping, GPT-NeoX's parallel
residual) changes parameters by far less than 0.1% and is named in the model's description,
so nothing is dropped silently. Families gpusim cannot build yet are refused by name.

T5-style encoder-decoders (t5, mt5, umt5) build a ``T5Config`` (gpusim/workload/zoo/t5.py)
rather than a ``TransformerConfig``; ``model_from_hf`` builds either family's model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpusim.errors import InvalidModel, InvalidProfile
from gpusim.hardware.catalog import format_validation_error, read_text_file
from gpusim.workload.model import Model
from gpusim.workload.zoo.t5 import DEFAULT_SEQ, MLPS, T5Config, build_t5
from gpusim.workload.zoo.transformer import TransformerConfig, build_transformer

# Rotary decoders with RMS norm and a gated MLP, the Llama layout, and what each family
# changes about it. Defaults are those of the family's transformers Config class.
_LLAMA_LIKE: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {},
    "qwen2": {"qkv_bias": True},  # Qwen2 projects q, k and v with a bias, o without
    "qwen3": {"qk_norm": True},  # Qwen3Attention's q_norm and k_norm over each head
    "phi3": {},
    "gemma": {"tied": True},
    "gemma2": {"tied": True, "global_every": 2,
               "note": "post-attention and post-MLP norms and logit soft-capping not "
                       "modelled"},
    "gemma3_text": {"tied": True, "global_every": "sliding_window_pattern", "qk_norm": True,
                    "note": "post-attention and post-MLP norms not modelled"},
    # mixtures of experts: every block's MLP replaced by routed experts
    "mixtral": {"experts": "num_local_experts", "expert_ffn": "intermediate_size"},
    "qwen2_moe": {"qkv_bias": True, "experts": "num_experts",
                  "expert_ffn": "moe_intermediate_size",
                  "shared_ffn": "shared_expert_intermediate_size",
                  "note": "the shared expert's sigmoid gate not modelled"},
    "qwen3_moe": {"experts": "num_experts", "expert_ffn": "moe_intermediate_size",
                  "qk_norm": True},
    # OlmoeAttention normalizes q and k across the whole projection, not per head: the
    # same elements, costed per head (its two norm weights counted at head_dim)
    "olmoe": {"experts": "num_experts", "expert_ffn": "intermediate_size", "qk_norm": True,
              "note": "q and k norms over the whole projection costed per head"},
}
_OTHERS = ("gpt2", "gpt_neox", "gptj", "phi", "bert", "roberta")
_VISION = ("vit", "clip_vision_model")  # image transformers: patches and a class token
_DEEPSEEK = ("deepseek_v2", "deepseek_v3")  # MLA attention, dense first blocks, experts
_NOT_YET = {
    "clip": "a vision and text pair (give its vision_config as a clip_vision_model config "
    "to build the image tower)",
}
# Encoder-decoders and the defaults of their transformers Config classes: T5 v1.0 is ReLU
# with a tied head; mT5 (T5 v1.1's layout) gated GELU with a head of its own; UMT5 gated
# GELU, tied, with a relative position bias table in every self-attention.
_T5: dict[str, dict[str, Any]] = {
    "t5": {"mlp": "relu", "tied": True},
    "mt5": {"mlp": "gated-gelu", "tied": False},
    "umt5": {"mlp": "gated-gelu", "tied": True, "bias_every_layer": True},
}
SUPPORTED = (*_LLAMA_LIKE, *_DEEPSEEK, *_OTHERS, *_VISION, *_T5)

# The sequence length a config runs at unless told: its context, up to this (long-context
# models train most tokens at 4-8K and extend the context at the end).
LONGEST_DEFAULT_SEQ = 8192

# hidden_act / activation_function values of gated and plain MLPs
_GELU = {"gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_python", "quick_gelu"}


def is_hf_config(data: dict[str, Any]) -> bool:
    return "model_type" in data


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A config.json as a mapping: strict JSON (a key given twice, NaN or Infinity is an
    error), or InvalidModel saying what is wrong."""
    path = Path(path)
    try:
        text = read_text_file(path)
    except InvalidProfile as exc:
        raise InvalidModel(str(exc)) from exc

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise InvalidModel(f"{path}: key {twice[0]!r} given twice")
        return dict(pairs)

    def no_constants(name: str) -> Any:
        raise InvalidModel(f"{path}: {name} is not a number a config may hold")

    try:
        data = json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constants)
    except json.JSONDecodeError as exc:
        raise InvalidModel(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from exc
    if not isinstance(data, dict):
        raise InvalidModel(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


class _Fields:
    """Typed reads of a config's fields, each failure a one-line InvalidModel."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        self.data, self.source = data, source

    def count(self, *keys: str, default: int | None = None) -> int | None:
        for key in keys:
            value = self.data.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidModel(f"{self.source}: {key} must be a positive integer, "
                                   f"not {value!r}")
            return value
        return default

    def fraction(self, *keys: str, default: float) -> float:
        """A number in (0, 1], the first of ``keys`` given."""
        for key in keys:
            value = self.data.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 < value <= 1:
                raise InvalidModel(f"{self.source}: {key} must be a number in (0, 1], "
                                   f"not {value!r}")
            return float(value)
        return default

    def need(self, *keys: str) -> int:
        value = self.count(*keys)
        if value is None:
            raise InvalidModel(f"{self.source}: {' or '.join(keys)} is missing")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise InvalidModel(f"{self.source}: {key} must be true or false, not {value!r}")
        return value

    def text(self, *keys: str, default: str = "") -> str:
        for key in keys:
            value = self.data.get(key)
            if value is not None:
                if not isinstance(value, str):
                    raise InvalidModel(f"{self.source}: {key} must be a string, "
                                       f"not {value!r}")
                return value
        return default


def _activation(act: str, gated: bool, source: str) -> str:
    if act in ("silu", "swish"):
        if not gated:
            raise InvalidModel(f"{source}: a plain (ungated) SiLU MLP is not modelled")
        return "swiglu"
    if act in _GELU:
        return "geglu" if gated else "gelu"
    raise InvalidModel(f"{source}: hidden activation {act!r} is not modelled "
                       f"(silu or gelu variants are)")


def _deepseek(f: _Fields, source: str) -> dict[str, Any]:
    """DeepSeek-V2/V3: MLA attention, the first blocks dense, routed and shared experts."""
    if f.count("moe_layer_freq", default=1) != 1:
        raise InvalidModel(f"{source}: moe_layer_freq other than 1 is not modelled")
    expert_ffn = f.need("moe_intermediate_size")
    return {
        "layers": f.need("num_hidden_layers"), "hidden": f.need("hidden_size"),
        "heads": f.need("num_attention_heads"), "ffn_hidden": f.need("intermediate_size"),
        "vocab": f.need("vocab_size"), "norm": "rmsnorm", "positions": "rotary",
        "activation": _activation(f.text("hidden_act", default="silu"), True, source),
        "tied_embeddings": f.flag("tie_word_embeddings", False), "bias": False,
        "experts": f.need("n_routed_experts"), "top_k": f.need("num_experts_per_tok"),
        "moe_ffn": expert_ffn,
        "shared_ffn": (f.count("n_shared_experts", default=0) or 0) * expert_ffn,
        "dense_layers": f.count("first_k_dense_replace", default=0) or 0,
        "kv_lora_rank": f.need("kv_lora_rank"), "q_lora_rank": f.count("q_lora_rank") or 0,
        "qk_nope_head_dim": f.need("qk_nope_head_dim"),
        "qk_rope_head_dim": f.need("qk_rope_head_dim"), "v_head_dim": f.need("v_head_dim"),
        # group-limited routing (DeepSeek-V3: each token's experts in 4 of 8 groups)
        "expert_groups": f.count("n_group", default=0) or 0,
        "groups_per_token": f.count("topk_group", default=0) or 0,
    }


def _window(f: _Fields, family: dict[str, Any]) -> dict[str, Any]:
    """Sliding-window attention as the family applies it: to every block (Mistral, Phi-3),
    every other (Gemma 2), or all but every n-th (Gemma 3); Qwen2 only when it says so."""
    window = f.count("sliding_window")
    if window is None or f.data.get("use_sliding_window") is False:
        return {}
    every = family.get("global_every", 0)
    if isinstance(every, str):
        every = f.count(every, default=6)
    return {"sliding_window": window, "global_every": every}


def _experts(f: _Fields, family: dict[str, Any], source: str) -> dict[str, Any]:
    """A mixture-of-experts family's expert fields: every decoder_sparse_step-th block
    sparse (Qwen2-MoE's rule, (i + 1) % step == 0), the others dense; a list of dense
    blocks (mlp_only_layers) is not modelled."""
    if f.data.get("mlp_only_layers"):
        raise InvalidModel(f"{source}: a list of dense blocks among the sparse ones "
                           f"(mlp_only_layers) is not modelled; every decoder_sparse_step-th "
                           f"block sparse is")
    fields: dict[str, Any] = {"experts": f.need(family["experts"]),
                              "top_k": f.need("num_experts_per_tok"),
                              "moe_ffn": f.need(family["expert_ffn"]),
                              "moe_every": f.count("decoder_sparse_step", default=1) or 1}
    if "shared_ffn" in family:
        fields["shared_ffn"] = f.count(family["shared_ffn"], default=0) or 0
    return fields


def _check_kind(kind: Any, source: str) -> None:
    """A model_type gpusim reads, or InvalidModel saying why not."""
    if not isinstance(kind, str) or not kind:
        raise InvalidModel(f"{source}: no model_type; a Hugging Face config.json names its "
                           f"family there")
    if kind in _NOT_YET:
        raise InvalidModel(f"{source}: model_type {kind!r} is {_NOT_YET[kind]}, which gpusim "
                           f"cannot build yet; it reads {', '.join(SUPPORTED)}")
    if kind not in SUPPORTED:
        raise InvalidModel(f"{source}: unknown model_type {kind!r}; gpusim reads "
                           f"{', '.join(SUPPORTED)}")


def _dropout_rate(data: dict[str, Any], source: str) -> float:
    rate = data.get("dropout_rate", 0.1)
    if rate is None:
        return 0.1
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
        raise InvalidModel(f"{source}: dropout_rate must be a number from 0 up to 1, "
                           f"not {rate!r}")
    return float(rate)


def t5_from_hf(data: dict[str, Any], source: str, name: str | None = None,
               seq_len: int | None = None, repo: str = "",
               decoder_seq_len: int | None = None) -> T5Config:
    """The T5Config of a t5, mt5 or umt5 config mapping. Its errors name the family as an
    encoder-decoder, whose fields (d_model, d_kv, d_ff, num_layers, num_heads) are not the
    decoders' names."""
    kind = data.get("model_type")
    _check_kind(kind, source)
    assert isinstance(kind, str)
    if kind not in _T5:
        raise InvalidModel(f"{source}: model_type {kind!r} is not an encoder-decoder")
    family = _T5[kind]
    f = _Fields(data, f"{source} ({kind} encoder-decoder)")
    proj = f.text("feed_forward_proj", default=family["mlp"])
    mlp = next((m for m in MLPS if m == proj), None)
    if mlp is None:
        raise InvalidModel(f"{f.source}: feed_forward_proj {proj!r} is not modelled "
                           f"({', '.join(MLPS)} are)")
    layers = f.need("num_layers")
    what = f"{repo} ({kind} config)" if repo else f"Hugging Face {kind} config"
    return T5Config(
        name=name or kind, layers=layers,
        decoder_layers=f.count("num_decoder_layers", default=layers) or layers,
        d_model=f.need("d_model"), d_kv=f.count("d_kv", default=64) or 64,
        d_ff=f.need("d_ff"), heads=f.need("num_heads"), vocab=f.need("vocab_size"),
        mlp=mlp,
        tied=f.flag("tie_word_embeddings", family["tied"]),
        buckets=f.count("relative_attention_num_buckets", default=32) or 32,
        bias_every_layer=family.get("bias_every_layer", False),
        seq_len=seq_len or min(f.count("n_positions", default=DEFAULT_SEQ) or DEFAULT_SEQ,
                               LONGEST_DEFAULT_SEQ),
        decoder_seq_len=decoder_seq_len, dropout=_dropout_rate(data, f.source) > 0,
        description=what + "; the relative position bias add is not costed",
        source=source)


def model_from_hf(data: dict[str, Any], source: str, name: str | None = None,
                  seq_len: int | None = None, repo: str = "",
                  decoder_seq_len: Any = None) -> Model:
    """The model a Hugging Face config mapping describes: an encoder-decoder (t5, mt5,
    umt5) with ``decoder_seq_len`` target tokens (default: as many as its inputs), or a
    transformer of one stack."""
    if decoder_seq_len is not None and (isinstance(decoder_seq_len, bool) or not isinstance(
            decoder_seq_len, int) or decoder_seq_len <= 0):
        raise InvalidModel(f"{source}: decoder_seq_len must be a positive integer, "
                           f"not {decoder_seq_len!r}")
    if data.get("model_type") in _T5:
        return build_t5(t5_from_hf(data, source, name, seq_len, repo, decoder_seq_len))
    if decoder_seq_len is not None:
        raise InvalidModel(f"{source}: decoder_seq_len applies to encoder-decoders "
                           f"({', '.join(_T5)}), not model_type {data.get('model_type')!r}")
    return build_transformer(transformer_from_hf(data, source, name, seq_len, repo))


def transformer_from_hf(data: dict[str, Any], source: str, name: str | None = None,
                        seq_len: int | None = None, repo: str = "") -> TransformerConfig:
    """The TransformerConfig of a Hugging Face config mapping (``model_type`` and its
    family's fields); ``repo`` names the model repository it came from."""
    kind = data.get("model_type")
    _check_kind(kind, source)
    if kind in _T5:
        raise InvalidModel(f"{source}: model_type {kind!r} is an encoder-decoder; "
                           f"model_from_hf builds it")
    f = _Fields(data, source)
    fields: dict[str, Any] = {"name": name or kind}
    if kind in _LLAMA_LIKE:
        family = _LLAMA_LIKE[kind]
        heads = f.need("num_attention_heads")
        fields.update(
            layers=f.need("num_hidden_layers"), hidden=f.need("hidden_size"), heads=heads,
            kv_heads=f.count("num_key_value_heads", default=heads),
            head_dim=f.count("head_dim"), ffn_hidden=f.need("intermediate_size"),
            vocab=f.need("vocab_size"), norm="rmsnorm", positions="rotary",
            activation=_activation(f.text("hidden_activation", "hidden_act", default="silu"),
                                   True, source),
            tied_embeddings=f.flag("tie_word_embeddings", family.get("tied", False)),
            bias=f.flag("attention_bias", False) or f.flag("mlp_bias", False),
            qkv_bias=f.flag("attention_bias", family.get("qkv_bias", False)),
            qk_norm=family.get("qk_norm", False),
        )
        note = family.get("note", "")
        if "experts" in family:
            fields.update(_experts(f, family, source))
        fields.update(_window(f, family))
    elif kind in _DEEPSEEK:
        fields.update(_deepseek(f, source))
        note = ("multi-token prediction layers left out (a run that trains them: "
                "TransformerConfig.mtp_layers)"
                if f.count("num_nextn_predict_layers", default=0) else "")
    elif kind == "gpt2":
        hidden = f.need("n_embd")
        fields.update(
            layers=f.need("n_layer"), hidden=hidden, heads=f.need("n_head"),
            ffn_hidden=f.count("n_inner", default=4 * hidden), vocab=f.need("vocab_size"),
            max_positions=f.count("n_positions"), norm="layernorm", positions="learned",
            activation=_activation(f.text("activation_function", default="gelu_new"), False,
                                   source),
            tied_embeddings=f.flag("tie_word_embeddings", True), bias=True)
        note = ""
    elif kind == "gpt_neox":
        # GPTNeoXLayer: with use_parallel_residual (its default), attention and MLP read
        # the block input through a norm each and add to it together
        fields.update(
            layers=f.need("num_hidden_layers"), hidden=f.need("hidden_size"),
            heads=f.need("num_attention_heads"), ffn_hidden=f.need("intermediate_size"),
            vocab=f.need("vocab_size"), norm="layernorm", positions="rotary",
            activation=_activation(f.text("hidden_act", default="gelu"), False, source),
            tied_embeddings=f.flag("tie_word_embeddings", False), bias=True,
            parallel_residual=f.flag("use_parallel_residual", True),
            rotary_fraction=f.fraction("rotary_pct", default=0.25))
        note = ""
    elif kind in ("gptj", "phi"):
        # GPTJBlock and PhiDecoderLayer: one norm, attention and MLP on its output in
        # parallel, both added to the block input; rotary on part of each head (GPT-J's
        # rotary_dim of 64 dimensions, Phi's partial_rotary_factor of 0.5)
        hidden = f.need("n_embd", "hidden_size")
        heads = f.need("n_head", "num_attention_heads")
        rotary = f.fraction("partial_rotary_factor", default=0.5) if kind == "phi" else \
            min(1.0, (f.count("rotary_dim") or 64) * heads / hidden)
        fields.update(
            layers=f.need("n_layer", "num_hidden_layers"), hidden=hidden, heads=heads,
            rotary_fraction=rotary,
            kv_heads=f.count("num_key_value_heads"),
            ffn_hidden=f.count("n_inner", "intermediate_size", default=4 * hidden),
            vocab=f.need("vocab_size"), norm="layernorm", positions="rotary",
            activation=_activation(f.text("activation_function", "hidden_act",
                                          default="gelu_new"), False, source),
            tied_embeddings=f.flag("tie_word_embeddings", False), bias=True,
            parallel_residual=True, shared_norm=True)
        note = "the head's bias is costed as the others'"
    elif kind in _VISION:
        labels = data.get("id2label")
        classes = len(labels) if isinstance(labels, dict) and len(labels) > 2 else 1000
        fields.update(
            layers=f.need("num_hidden_layers"), hidden=f.need("hidden_size"),
            heads=f.need("num_attention_heads"), ffn_hidden=f.need("intermediate_size"),
            kind="vision", image_size=f.count("image_size", default=224),
            patch_size=f.count("patch_size", default=16),
            channels=f.count("num_channels", default=3), classes=classes,
            norm="layernorm", positions="learned", tied_embeddings=False,
            activation=_activation(f.text("hidden_act", default="gelu"), False, source),
            bias=True)
        note = (f"classified over {classes} classes"
                + ("" if kind == "vit" else "; CLIP's pre-encoder norm, projection and "
                   "contrastive loss are not modelled (the image tower is, with a "
                   "classifier head in their place)"))
    else:  # bert, roberta: encoders with learned positions and token types
        fields.update(
            layers=f.need("num_hidden_layers"), hidden=f.need("hidden_size"),
            heads=f.need("num_attention_heads"), ffn_hidden=f.need("intermediate_size"),
            vocab=f.need("vocab_size"), kind="encoder", norm="layernorm",
            positions="learned", max_positions=f.count("max_position_embeddings"),
            type_vocab=f.count("type_vocab_size", default=2),
            activation=_activation(f.text("hidden_act", default="gelu"), False, source),
            tied_embeddings=f.flag("tie_word_embeddings", True), bias=True)
        note = "the pooler is not modelled (masked-LM training does not use it)"
    context = f.count("max_position_embeddings", "n_positions")
    if seq_len is not None:
        fields["seq_len"] = seq_len
    elif context is not None:
        fields["seq_len"] = min(context, LONGEST_DEFAULT_SEQ)
    what = f"{repo} ({kind} config)" if repo else f"Hugging Face {kind} config"
    fields["description"] = what + (f"; {note}" if note else "")
    fields["source"] = source
    try:
        return TransformerConfig.model_validate(fields)
    except ValidationError as exc:
        raise InvalidModel(format_validation_error(source, exc)) from exc
