"""T5 encoder-decoders (gpusim/workload/zoo/t5.py): the shipped configs have their published
parameter counts, the layers are where T5 puts them (bias tables in the first block of each
stack, cross-attention over the encoder's length, a tied or untied head), the forward FLOPs
match a hand count, an estimate runs end to end, and bad configs are one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpusim import estimate
from gpusim.data import data_dir
from gpusim.errors import GpusimError, InvalidModel
from gpusim.hardware.catalog import read_yaml
from gpusim.workload import zoo
from gpusim.workload.attention import Attention, CrossEntropy, Embedding
from gpusim.workload.formats import load_model_file, model_from_dict
from gpusim.workload.layers import Linear
from gpusim.workload.model import Model
from gpusim.workload.zoo.t5 import T5Config, build_t5

SHIPPED = ("t5-small", "t5-base", "t5-large", "flan-t5-base", "flan-t5-large")
# google-t5/t5-small config.json: no feed_forward_proj (ReLU) and no tie_word_embeddings
# (tied) fields, as published.
T5_SMALL = {"model_type": "t5", "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_heads": 8,
            "num_layers": 6, "vocab_size": 32128, "relative_attention_num_buckets": 32,
            "dropout_rate": 0.1, "n_positions": 512}


def _yaml(name: str) -> dict[str, Any]:
    return read_yaml(data_dir("models") / f"{name}.yaml")


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_t5_matches_its_published_parameter_count(name: str) -> None:
    published = float(_yaml(name)["published_parameters"])
    assert abs(zoo.get(name).parameters / published - 1) <= 0.01


def test_t5_base_parameters_by_hand() -> None:
    """Every weight of T5-base counted by hand: the shared table once (the head is tied),
    12 encoder blocks of q, k, v, o, wi, wo and two norm weights, 12 decoder blocks with
    cross-attention and a third norm, two final norms, and one 32 x 12 bias table per
    stack."""
    d, inner, ff, vocab, heads = 768, 12 * 64, 3072, 32128, 12
    encoder = 12 * (4 * d * inner + 2 * d * ff + 2 * d)
    decoder = 12 * (8 * d * inner + 2 * d * ff + 3 * d)
    expected = vocab * d + encoder + decoder + 2 * d + 2 * 32 * heads
    assert expected == 222_903_552
    assert zoo.get("t5-base").parameters == expected


def test_layers_are_where_t5_puts_them() -> None:
    model = model_from_dict({"name": "t5-small", **T5_SMALL}, "t5.json", 512)
    tables = [la for la in model.layers if la.name.endswith("relative_bias")]
    assert [la.block for la in tables] == ["encoder.0", "decoder.0"]
    assert all(isinstance(la, Embedding) and la.params == 32 * 8 for la in tables)
    assert not any(isinstance(la, Linear) and la.bias for la in model.layers)
    cores = {la.name: la for la in model.layers if isinstance(la, Attention)}
    assert not cores["encoder.0.attn.core"].causal and cores["decoder.0.attn.core"].causal
    head = next(la for la in model.layers if la.name == "head.vocab")
    assert isinstance(head, Linear) and head.shared and head.tied_to == "embed.tokens"
    assert any(la.name == "head.scale" for la in model.layers)  # d_model^-0.5, tied only
    lead, body, tail = model.partition()
    assert [la.name for la in lead] == ["embed.tokens", "embed.dropout"]
    assert len(body) == 12 and body[5][-1].name == "encoder.final_dropout"
    assert {la.name for la in tail} >= {"final_norm", "head.vocab", "loss"}


def test_flan_t5_has_a_gated_mlp_and_a_head_of_its_own() -> None:
    tied, flan = zoo.get("t5-base"), zoo.get("flan-t5-base")
    wi = next(la for la in flan.layers if la.name == "encoder.0.mlp.wi")
    assert isinstance(wi, Linear) and wi.out_features == 2 * 2048  # wi_0 and wi_1
    head = next(la for la in flan.layers if la.name == "head.vocab")
    assert isinstance(head, Linear) and not head.shared and head.params == 32128 * 768
    assert not any(la.name == "head.scale" for la in flan.layers)
    # the same attention; the MLPs differ (3 x 2048 against 2 x 3072 a block), and the head
    assert flan.parameters - tied.parameters == 32128 * 768


def test_umt5_has_a_bias_table_in_every_self_attention() -> None:
    cfg = {**T5_SMALL, "model_type": "umt5", "num_layers": 2, "vocab_size": 1000}
    model = model_from_dict(cfg, "umt5.json")
    tables = [la.block for la in model.layers if la.name.endswith("relative_bias")]
    assert tables == ["encoder.0", "encoder.1", "decoder.0", "decoder.1"]
    wi = next(la for la in model.layers if la.name == "encoder.0.mlp.wi")
    assert isinstance(wi, Linear) and wi.out_features == 2 * 2048  # gated GELU by default


def test_the_decoder_may_be_shorter_than_the_encoder(tmp_path: Path) -> None:
    path = tmp_path / "t5-short.yaml"
    path.write_text("name: t5-short\ndecoder_seq_len: 128\nhf_config:\n" + "".join(
        f"  {k}: {v!r}\n" if isinstance(v, str) else f"  {k}: {v}\n"
        for k, v in T5_SMALL.items()))
    short = load_model_file(path, seq_len=512)
    same = zoo.get("t5-small", seq_len=512)
    cross = next(la for la in short.layers if la.name == "decoder.0.cross.core")
    assert isinstance(cross, Attention) and (cross.seq, cross.keys) == (128, 512)
    kv = next(la for la in short.layers if la.name == "decoder.0.cross.kv")
    assert isinstance(kv, Linear) and kv.rows == 512  # keys and values from the encoder
    loss = next(la for la in short.layers if isinstance(la, CrossEntropy))
    assert loss.rows == 128  # the loss is over the decoder's tokens
    assert short.parameters == same.parameters
    assert short.tokens_per_sample == same.tokens_per_sample == 512  # inputs
    assert short.forward_flops_per_sample < same.forward_flops_per_sample
    # by default the decoder is as long as the encoder
    assert next(la for la in same.layers if isinstance(la, CrossEntropy)).rows == 512


def _matmul_params(model: Model, prefix: str) -> int:
    return sum(la.in_features * la.out_features for la in model.layers
               if isinstance(la, Linear) and la.name.startswith(prefix))


def test_forward_flops_match_a_hand_count() -> None:
    """2 FLOPs per multiply-add: each matrix's parameters times the tokens it multiplies
    (the encoder's, the decoder's, or the encoder's for the cross-attention's keys and
    values), plus the attention products: QK^T and AV over enc x enc pairs in the encoder,
    half of dec x dec in the causal decoder, and dec x enc in cross-attention."""
    enc, dec, inner, vocab, d = 512, 128, 8 * 64, 32128, 512
    model = build_t5(T5Config("t5-small", 6, 6, 512, 64, 2048, 8), enc, dec)
    encoder = _matmul_params(model, "encoder.")
    cross_kv = 6 * d * 2 * inner
    decoder = _matmul_params(model, "decoder.") - cross_kv
    assert encoder == 6 * (4 * d * inner + 2 * d * 2048)
    dense = 2 * (encoder * enc + cross_kv * enc + decoder * dec + d * vocab * dec)
    attention = 6 * 4 * inner * (enc * enc + dec * dec / 2 + dec * enc)
    assert model.forward_flops_per_sample == pytest.approx(dense + attention, rel=0.01)


def test_an_estimate_runs_end_to_end() -> None:
    result = estimate("t5-base", "a100-80gb", batch_size=8, seq_len=512, precision="bf16")
    assert result.step.step_time_s > 0
    assert result.step.tokens_per_sample == 512


@pytest.mark.parametrize(("data", "message"), [
    ({k: v for k, v in T5_SMALL.items() if k != "d_model"}, "d_model is missing"),
    ({**T5_SMALL, "num_heads": 0}, "num_heads must be a positive integer"),
    ({**T5_SMALL, "d_ff": 2048.5}, "d_ff must be a positive integer"),
    ({**T5_SMALL, "feed_forward_proj": "gated-tanh"}, "feed_forward_proj 'gated-tanh'"),
    ({**T5_SMALL, "tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
    ({**T5_SMALL, "dropout_rate": 1.5}, "dropout_rate must be a number"),
    ({**T5_SMALL, "decoder_seq_len": -1}, "decoder_seq_len must be a positive integer"),
    ({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 100,
      "decoder_seq_len": 64}, "decoder_seq_len applies to encoder-decoders"),
])
def test_bad_t5_configs_are_one_line_errors(data: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidModel, match=message) as err:
        model_from_dict(data, "config.json")
    assert isinstance(err.value, GpusimError)
    assert "\n" not in str(err.value)


def test_a_t5_config_built_in_python_is_checked() -> None:
    with pytest.raises(InvalidModel, match="heads must be a positive integer"):
        T5Config("bad", 2, 2, 512, 64, 2048, 0)
    with pytest.raises(InvalidModel, match="MLP 'swish'"):
        T5Config("bad", 2, 2, 512, 64, 2048, 8, mlp="swish")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["t5-small", "flan-t5-base"])
def test_parameters_match_transformers(name: str) -> None:
    """The count of transformers' own T5 built from the shipped config, on the meta device
    (no weights, no download); skipped where transformers is not installed."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    fields = {k: v for k, v in _yaml(name)["hf_config"].items()
              if k not in ("model_type", "architectures")}
    with torch.device("meta"):
        reference = transformers.T5ForConditionalGeneration(transformers.T5Config(**fields))
    assert zoo.get(name).parameters == reference.num_parameters()  # shared weights once
