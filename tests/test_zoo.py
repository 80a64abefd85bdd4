"""The zoo matches published parameter counts and FLOPs."""

from __future__ import annotations

import pytest

from gpusim.errors import InvalidModel, UnknownModel
from gpusim.estimation import estimate
from gpusim.workload import zoo
from gpusim.workload.model import Model
from gpusim.workload.numerics import FP32
from gpusim.workload.zoo.transformer import TRANSFORMERS, build_transformer

# Published parameter counts: torchvision model docs; Devlin et al. 2019; Radford et al.
# 2019 (Hugging Face configs); Brown et al. 2020; Meta Llama model cards.
PUBLISHED = {
    "resnet50": (25.6e6, 0.01),
    "vgg16": (138.4e6, 0.01),
    "alexnet": (61.1e6, 0.01),
    "bert-base": (110e6, 0.02),
    "bert-large": (340e6, 0.02),
    "gpt2": (124e6, 0.01),
    "gpt2-medium": (355e6, 0.01),
    "gpt2-xl": (1.5e9, 0.05),
    "gpt3-125m": (125e6, 0.01),
    "gpt3-1.3b": (1.3e9, 0.02),
    "gpt3-175b": (175e9, 0.01),
    "llama2-7b": (6.74e9, 0.01),
    "llama3-8b": (8.03e9, 0.01),
    "llama3-70b": (70.6e9, 0.01),
    # torchvision's vit_b_16 and vit_l_16 (86,567,656 and 304,326,632), ViT paper's 632M
    "vit-b16": (86_567_656, 1e-9),
    "vit-l16": (304_326_632, 1e-9),
    "vit-h14": (632e6, 0.01),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_published(name: str) -> None:
    expected, tolerance = PUBLISHED[name]
    assert zoo.get(name).parameters == pytest.approx(expected, rel=tolerance)


def test_resnet50_forward_is_about_4_1_gmac() -> None:
    # He et al. 2016, Table 1: 3.8e9 FLOPs (multiply-adds) for v1; v1.5 is about 4.1 GMAC.
    gmac = zoo.get("resnet50").forward_flops_per_sample / 2 / 1e9
    assert gmac == pytest.approx(4.1, rel=0.03)


@pytest.mark.parametrize(("name", "gmac"), [("vit-b16", 17.56), ("vit-l16", 61.55)])
def test_vision_transformer_forward_matches_torchvision(name: str, gmac: float) -> None:
    """torchvision's docs count multiply-adds (GFLOPS 17.56 for vit_b_16, 61.55 for
    vit_l_16); gpusim counts both halves of each."""
    model = zoo.get(name)
    assert model.forward_flops_per_sample / 2 / 1e9 == pytest.approx(gmac, rel=0.01)
    assert model.tokens_per_sample == 0  # images, not tokens


def test_a_vision_transformer_takes_another_image_size() -> None:
    small, large = zoo.get("vit-b16", image_size=224), zoo.get("vit-b16", image_size=384)
    # More patches: more positions in the table, and attention over (384/16)^2 + 1 tokens.
    assert large.parameters - small.parameters == (24 * 24 - 14 * 14) * 768
    assert large.forward_flops_per_sample > 2.9 * small.forward_flops_per_sample
    with pytest.raises(UnknownModel, match="takes no image size"):
        zoo.get("gpt2", image_size=224)


def test_vgg16_forward_is_about_15_5_gmac() -> None:
    assert zoo.get("vgg16").forward_flops_per_sample / 2 / 1e9 == pytest.approx(15.5, rel=0.02)


@pytest.mark.parametrize("name", ["gpt2", "gpt3-1.3b", "gpt3-175b", "llama3-8b"])
def test_transformer_step_is_six_n_t_plus_attention(name: str) -> None:
    model = zoo.get(name)
    cfg = zoo.transformer_config(name)
    assert cfg is not None and model.tokens_per_sample
    s = model.tokens_per_sample
    # Every parameter in a matrix product costs 6 FLOP per token (forward 2, backward 4);
    # lookup tables cost nothing, and a tied head multiplies by the token table once more.
    tables = cfg.vocab * cfg.hidden + (cfg.max_positions or s) * cfg.hidden * (
        cfg.positions == "learned")
    head = cfg.vocab * cfg.hidden if cfg.tied_embeddings else 0
    dense = 6 * (model.parameters - tables + head) * s
    # Causal fused attention: 2 products of s x s x d per head, halved by the mask, forward
    # 1x and backward 2.5x (it recomputes the scores).
    attention = 3.5 * 2 * s * s * cfg.dim_head * cfg.heads * cfg.layers
    expected = dense + attention
    assert model.training_flops_per_sample == pytest.approx(expected, rel=0.03)


def test_every_zoo_model_builds() -> None:
    for name in zoo.names():
        try:
            model = zoo.get(name)
        except InvalidModel as exc:  # a shipped mixture-of-experts config, kept for later
            assert name in zoo.shipped_configs() and "mixture of experts" in str(exc)
            continue
        assert model.parameters > 0 and model.forward_flops_per_sample > 0


def test_seq_len_changes_a_transformer_but_not_its_parameters() -> None:
    short, long = zoo.get("gpt2", seq_len=256), zoo.get("gpt2", seq_len=1024)
    assert short.parameters == long.parameters
    assert short.forward_flops_per_sample < long.forward_flops_per_sample


def test_unknown_model_suggests() -> None:
    with pytest.raises(UnknownModel, match="did you mean resnet50"):
        zoo.get("resnet5")


@pytest.mark.parametrize("activation, element", [("fp16", 2), ("fp32", 4)])
def test_dropout_mask_is_one_byte_whatever_the_data_type(activation: str, element: int) -> None:
    from gpusim.workload.attention import Attention
    from gpusim.workload.layers import dropout
    from gpusim.workload.numerics import Numerics

    num = Numerics(activation, activation, activation)
    e = 1000
    fwd, = dropout("d", e).forward(1, num)
    bwd, = dropout("d", e).backward_input(1, num)
    assert fwd.bytes == e * (2 * element + 1)  # read x; write y and the mask
    assert bwd.bytes == e * (2 * element + 1)  # read dy and the mask; write dx
    assert dropout("d", e).saved_bytes(1, num) == e

    att = Attention("a", heads=2, head_dim=8, seq=16, fused=False, dropout=True)
    plain = Attention("a", heads=2, head_dim=8, seq=16, fused=False)
    scores = 2 * 16 * 16
    # softmax output, bool mask, dropped probabilities (Korthikanti et al. 2022: 5 as^2b)
    assert att.saved_bytes(1, num) - plain.saved_bytes(1, num) == scores * (element + 1)
    drop = next(op for op in att.forward(1, num) if op.name.endswith("dropout"))
    assert drop.bytes == scores * (2 * element + 1)


@pytest.mark.parametrize("activation, forward, backward", [
    ("bf16", 2 + 4 + 8, 4 + 12 + 4 + 2),  # cast up; log-softmax | fill, log-softmax, cast down
    ("fp32", 8, 4 + 12),
])
def test_cross_entropy_moves_what_pytorchs_kernels_move(activation: str, forward: int,
                                                        backward: int) -> None:
    """Bytes per logit: PyTorch computes the loss in fp32 through a kept log-softmax, and
    the likelihood's gradient is a zero-filled tensor the size of the logits."""
    from gpusim.workload.attention import CrossEntropy
    from gpusim.workload.numerics import Numerics

    num = Numerics(activation, activation, activation)
    loss = CrossEntropy("loss", classes=50_000, rows=100)
    e = 100 * 50_000
    assert sum(op.bytes for op in loss.forward(1, num)) == pytest.approx(e * forward, rel=1e-3)
    assert sum(op.bytes for op in loss.backward_input(1, num)) == pytest.approx(e * backward,
                                                                             rel=1e-3)
    assert loss.saved_bytes(1, num) == e * 4


def _bert(**update: object) -> Model:
    cfg = TRANSFORMERS["bert-large"].model_copy(update=update)
    return build_transformer(cfg, 128)


def test_a_dense_masked_lm_head_runs_on_the_predicted_positions_only() -> None:
    every, dense = _bert(), _bert(predicted_positions=20)
    layers = {la.name: la for la in dense.layers}
    assert layers["head.vocab"].rows == layers["head.transform"].rows == 20
    assert layers["loss"].rows == 20
    # The encoder and the parameters are the same; the head's work shrinks to 20/128.
    assert dense.parameters == every.parameters
    head = [sum(op.flops for la in m.layers if la.block == "head" for op in la.forward(1, FP32))
            for m in (every, dense)]
    assert head[1] == pytest.approx(head[0] * 20 / 128, rel=1e-3)
    # The gather's backward writes the whole sequence's gradient (zeros, then the rows).
    gather = layers["head.gather"]
    assert gather.elements == 20 * 1024 and gather.bwd_writes * 20 == 128 + 20
    # A sequence shorter than the predictions predicts every position, with no gather.
    short = build_transformer(TRANSFORMERS["bert-large"].model_copy(
        update={"predicted_positions": 80}), 64)
    assert {la.name: la for la in short.layers}["head.vocab"].rows == 64
    assert "head.gather" not in {la.name for la in short.layers}


def test_a_dense_head_makes_pre_training_faster_by_the_heads_share() -> None:
    every = estimate(_bert(), "a100-80gb", 64, precision="fp16").step.step_time_s
    dense = estimate(_bert(predicted_positions=20), "a100-80gb", 64,
                     precision="fp16").step.step_time_s
    assert 0.8 * every < dense < 0.97 * every


def test_a_span_head_predicts_a_start_and_an_end_over_the_positions() -> None:
    squad = _bert(head="span")
    head, loss = squad.layers[-2], squad.layers[-1]
    assert (head.name, head.out_features) == ("head.span", 2)
    assert (loss.classes, loss.rows) == (128, 2)
    assert not any(la.name.startswith(("head.vocab", "head.transform")) for la in squad.layers)
    # no masked-LM transform (h x h + h, norm 2h) nor decoder bias, a 2 x h + 2 span head
    h, vocab = 1024, 30522
    assert _bert().parameters - squad.parameters == (h * h + h) + 2 * h + vocab - (2 * h + 2)


def test_head_settings_are_for_encoders_only() -> None:
    with pytest.raises(ValueError, match="encoder"):
        TRANSFORMERS["gpt2"].model_copy(update={"kind": "decoder"}).model_validate(
            {**TRANSFORMERS["gpt2"].model_dump(), "head": "span"})


def test_hand_written_attention_scales_and_masks_its_scores_in_passes_of_their_own() -> None:
    """BERT's attention as Hugging Face and NVIDIA wrote it divides the scores by
    sqrt(head_dim) and adds the mask, each a pass over the seq x seq scores, and the
    division's gradient is one more in backward."""
    plain, written = _bert(), _bert(scale_and_mask=True)
    core = {m: next(la for la in m.layers if la.name == "h.0.attn.core")
            for m in (plain, written)}
    scores = 16 * 128 * 128  # heads x seq x seq, one sample
    fwd = {m: sum(op.bytes for op in core[m].forward(1, FP32)) for m in core}
    bwd = {m: sum(op.bytes for op in core[m].backward_input(1, FP32)) for m in core}
    assert fwd[written] - fwd[plain] == 2 * 2 * scores * 4  # read and write, twice, fp32
    assert bwd[written] - bwd[plain] == 2 * scores * 4
    fused = TRANSFORMERS["bert-large"].model_copy(
        update={"scale_and_mask": True, "fused_attention": True})
    assert not any(getattr(la, "scale_and_mask", False)
                   for la in build_transformer(fused, 128).layers)


def test_a_parallel_block_reads_one_input_for_attention_and_mlp() -> None:
    """GPT-J, Phi and GPT-NeoX: x + attn(norm(x)) + mlp(norm(x)). One add per block takes
    both branches; with a shared norm the MLP's product keeps nothing of its input (the
    tensor attention's product keeps). The products are those of a sequential block."""
    from gpusim.workload.hf_config import transformer_from_hf
    from gpusim.workload.layers import Elementwise, Linear
    from gpusim.workload.numerics import Numerics
    from gpusim.workload.zoo.transformer import TransformerConfig, build_transformer

    base = TransformerConfig(name="p", layers=2, hidden=512, heads=8, ffn_hidden=2048,
                             vocab=1000, seq_len=128, positions="rotary")
    serial = build_transformer(base)
    phi = build_transformer(base.model_copy(update={"parallel_residual": True,
                                                    "shared_norm": True}))
    neox = build_transformer(base.model_copy(update={"parallel_residual": True}))

    def block(model: Model, kind: str) -> list[Elementwise]:
        return [la for la in model.layers
                if la.block == "h.0" and isinstance(la, Elementwise) and la.op == kind]

    assert [len(block(m, "layer_norm")) for m in (serial, phi, neox)] == [2, 1, 2]
    assert [[a.reads for a in block(m, "add")] for m in (serial, phi, neox)] == \
        [[2, 2], [3], [3]]
    num = Numerics("bf16", "bf16", "bf16")
    up_phi = next(la for la in phi.layers if la.name == "h.0.mlp.up")
    up_neox = next(la for la in neox.layers if la.name == "h.0.mlp.up")
    assert isinstance(up_phi, Linear) and up_phi.saved_bytes(2, num) == 0
    assert up_neox.saved_bytes(2, num) > 0
    gemm = [sum(op.flops for la in m.layers for op in la.forward(1, num) if op.kind == "gemm")
            for m in (serial, phi, neox)]
    assert gemm[0] == gemm[1] == gemm[2]
    phi_hf = transformer_from_hf({"model_type": "phi", "hidden_size": 2048, "num_hidden_layers": 24,
                             "num_attention_heads": 32, "intermediate_size": 8192,
                             "vocab_size": 51200}, "phi-1_5")
    neox_hf = transformer_from_hf({"model_type": "gpt_neox", "hidden_size": 512,
                              "num_hidden_layers": 2, "num_attention_heads": 8,
                              "intermediate_size": 2048, "vocab_size": 1000}, "neox")
    assert (phi_hf.parallel_residual, phi_hf.shared_norm) == (True, True)
    assert (neox_hf.parallel_residual, neox_hf.shared_norm) == (True, False)
