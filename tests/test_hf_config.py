"""Hugging Face config.json files as models: each family's fields become the right layers,
the parameter counts match the published ones, and bad or unsupported configs are one-line
errors. The shipped configs (models/*.yaml) are checked against their published counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpusim.data import data_dir
from gpusim.errors import InvalidModel, UnknownModel
from gpusim.estimation import resolve_model
from gpusim.hardware.catalog import read_yaml
from gpusim.workload import zoo
from gpusim.workload.attention import Attention, Embedding
from gpusim.workload.formats import model_from_dict
from gpusim.workload.layers import Linear
from gpusim.workload.model import Model

# Config fields as the model repositories publish them (meta-llama/Meta-Llama-3-8B,
# Qwen/Qwen2-7B, openai-community/gpt2, google-bert/bert-base-uncased config.json).
LLAMA3_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "vocab_size": 128256, "max_position_embeddings": 8192,
             "tie_word_embeddings": False, "hidden_act": "silu"}
QWEN2_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
            "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
            "vocab_size": 152064, "max_position_embeddings": 131072,
            "tie_word_embeddings": False, "hidden_act": "silu"}
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024,
        "vocab_size": 50257, "activation_function": "gelu_new"}
BERT_BASE = {"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12,
             "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522,
             "max_position_embeddings": 512, "type_vocab_size": 2, "hidden_act": "gelu"}


def _write(tmp_path: Path, data: dict[str, Any], folder: str = "model") -> Path:
    path = tmp_path / folder / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_llama_3_8b_from_its_config_has_its_published_8_03b_parameters(
        tmp_path: Path) -> None:
    model = resolve_model(str(_write(tmp_path, LLAMA3_8B, "Meta-Llama-3-8B")))
    assert model.name == "Meta-Llama-3-8B"  # named after the snapshot's folder
    assert model.parameters == 8_030_261_248  # the safetensors total of the repository
    attn = next(la for la in model.layers if isinstance(la, Attention))
    assert (attn.heads, attn.kv_heads, attn.head_dim) == (32, 8, 128)
    assert model.tokens_per_sample == 8192  # its context, up to 8192 by default
    assert resolve_model(str(tmp_path / "Meta-Llama-3-8B" / "config.json"),
                         seq_len=2048).tokens_per_sample == 2048


def test_qwen2_biases_only_its_qkv_projection() -> None:
    model = model_from_dict(QWEN2_7B, "qwen2.json", 4096)
    linears = {la.name.split(".", 2)[-1]: la for la in model.layers
               if isinstance(la, Linear) and la.name.startswith("h.0.")}
    assert linears["attn.qkv"].bias and not linears["attn.proj"].bias
    assert not linears["mlp.up"].bias
    assert abs(model.parameters / 7.62e9 - 1) < 0.01  # "7.62B params" (model page)
    assert model.tokens_per_sample == 4096


def test_gpt2_and_bert_configs_match_the_zoo_models() -> None:
    gpt2 = model_from_dict(GPT2, "gpt2.json", 1024)
    assert gpt2.parameters == zoo.get("gpt2").parameters == 124_439_808
    bert = model_from_dict(BERT_BASE, "bert.json", 512)
    zoo_bert = zoo.get("bert-base")
    assert bert.parameters == zoo_bert.parameters
    assert [la.name for la in bert.layers if not la.name.endswith("dropout")] == \
        [la.name for la in zoo_bert.layers if not la.name.endswith("dropout")]


def test_vit_and_clip_vision_configs_build_image_transformers() -> None:
    # google/vit-large-patch16-224 config.json fields (its classifier over 1000 labels)
    vit_l = {"model_type": "vit", "hidden_size": 1024, "num_hidden_layers": 24,
             "num_attention_heads": 16, "intermediate_size": 4096, "image_size": 224,
             "patch_size": 16, "num_channels": 3, "hidden_act": "gelu",
             "id2label": {str(i): f"c{i}" for i in range(1000)}}
    model = model_from_dict(vit_l, "vit.json")
    assert model.parameters == zoo.get("vit-l16").parameters  # 304.3M (torchvision vit_l_16)
    # openai/clip-vit-large-patch14's vision_config: 14-pixel patches, quick GELU
    clip = {"model_type": "clip_vision_model", "hidden_size": 1024, "num_hidden_layers": 24,
            "num_attention_heads": 16, "intermediate_size": 4096, "image_size": 224,
            "patch_size": 14, "hidden_act": "quick_gelu", "projection_dim": 768}
    tower = model_from_dict(clip, "clip.json")
    patches = next(la for la in tower.layers if la.name == "embed.patches")
    assert patches.params == 3 * 14 * 14 * 1024 + 1024
    assert "contrastive loss are not modelled" in tower.description


def test_gemma_is_a_tied_gated_gelu_model() -> None:
    # google/gemma-7b config.json: head_dim 256 (16 heads over a 3072 hidden size).
    cfg = {"model_type": "gemma", "hidden_size": 3072, "intermediate_size": 24576,
           "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
           "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192,
           "hidden_act": "gelu"}
    model = model_from_dict(cfg, "gemma.json")
    assert abs(model.parameters / 8.54e9 - 1) < 0.01  # 8.54B with the tied 256k table
    head = next(la for la in model.layers if la.name == "head.vocab")
    assert isinstance(head, Linear) and head.shared


@pytest.mark.parametrize(("data", "message"), [
    ({"model_type": "t5", **{k: v for k, v in LLAMA3_8B.items() if k != "model_type"}},
     "t5 encoder-decoder\\): num_layers is missing"),  # T5's own fields, not Llama's
    ({**LLAMA3_8B, "model_type": "deepseek_v3", "moe_layer_freq": 2},
     "moe_layer_freq other than 1"),
    ({**LLAMA3_8B, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
      "moe_intermediate_size": 768, "mlp_only_layers": [0]}, "dense blocks"),
    ({**LLAMA3_8B, "model_type": "mixtral", "num_experts_per_tok": 2},
     "num_local_experts is missing"),
    ({"model_type": "mamba", "hidden_size": 768}, "unknown model_type 'mamba'"),
    ({"model_type": "clip", "vision_config": {}}, "a vision and text pair"),
    ({"hidden_size": 768}, "expected a 'transformer' mapping"),
    ({**LLAMA3_8B, "num_hidden_layers": 0}, "num_hidden_layers must be a positive integer"),
    ({**LLAMA3_8B, "num_hidden_layers": 32.5}, "num_hidden_layers must be a positive"),
    ({**LLAMA3_8B, "hidden_act": "relu2"}, "hidden activation 'relu2'"),
    ({**LLAMA3_8B, "tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
    ({k: v for k, v in LLAMA3_8B.items() if k != "hidden_size"}, "hidden_size is missing"),
    ({**LLAMA3_8B, "num_key_value_heads": 5}, "not divisible by kv_heads"),
])
def test_bad_or_unsupported_configs_are_one_line_errors(data: dict[str, Any],
                                                        message: str) -> None:
    with pytest.raises(InvalidModel, match=message) as err:
        model_from_dict(data, "config.json")
    assert "\n" not in str(err.value)
    if "unknown" in message or "mixture" in message:
        assert "llama" in str(err.value) and "gpt2" in str(err.value)  # what it reads


@pytest.mark.parametrize(("text", "message"), [
    ('{"model_type": "llama", "model_type": "gpt2"}', "given twice"),
    ('{"model_type": "llama", "hidden_size": NaN}', "NaN is not a number"),
    ('{"model_type": "llama",', "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
])
def test_malformed_config_files_are_one_line_errors(tmp_path: Path, text: str,
                                                    message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(InvalidModel, match=message):
        resolve_model(str(path))


SHIPPED = sorted(data_dir("models").glob("*.yaml"))
MOE: tuple[str, ...] = ()  # model families gpusim cannot build yet


def _counted(model: Model, counts: str) -> int:
    """The parameters a published figure counts: all, or without the token tables and an
    untied output head."""
    if counts != "non_embedding":
        return model.parameters
    tables = sum(la.params for la in model.layers if isinstance(la, Embedding)
                 or (la.name == "head.vocab" and isinstance(la, Linear) and not la.shared))
    return model.parameters - tables


def _shipped_error(path: Path) -> tuple[str, float] | None:
    """(how the published figure counts, relative error), or None for a family gpusim
    cannot build yet."""
    data = read_yaml(path)
    try:
        model = zoo.get(path.stem)
    except InvalidModel:
        assert data["hf_config"]["model_type"] in MOE
        return None
    counts = data.get("published_parameters_counts", "total")
    return counts, _counted(model, counts) / float(data["published_parameters"]) - 1


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_config_matches_its_published_parameter_count(path: Path) -> None:
    data = read_yaml(path)
    assert data["name"] == path.stem
    assert data["sources"]["config"].startswith("https://")
    assert data["sources"]["parameters"].startswith("https://")
    assert data["published_parameters_note"]
    found = _shipped_error(path)
    if found is None:
        return
    counts, error = found
    bound = {"total": 0.01, "non_embedding": 0.01, "size_class": 0.05}.get(counts)
    assert counts in ("total", "non_embedding", "size_class", "disputed")
    if bound is not None:
        assert abs(error) <= bound, (counts, error)


def test_enough_shipped_configs_build_and_match_exact_published_counts() -> None:
    """At least 40 configs build, and at least 30 of them match a published count printed
    to three digits or more (not just a size name like '7B') within 1%."""
    results = [_shipped_error(p) for p in SHIPPED]
    built = [r for r in results if r is not None]
    assert len(built) >= 40
    exact = [e for counts, e in built if counts in ("total", "non_embedding")]
    assert len(exact) >= 30 and all(abs(e) <= 0.01 for e in exact)
    assert {p.stem for p in SHIPPED} <= set(zoo.names())


def test_a_shipped_name_is_offered_when_mistyped() -> None:
    with pytest.raises(UnknownModel, match=r"qwen2\.5-7b"):
        zoo.get("qwen2.5-7c")
