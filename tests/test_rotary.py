"""Rotary position embeddings and QK norms: the kernels each framework runs on the queries
and keys before attention, and the measured files that predate them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gpusim.measure import results
from gpusim.stack import apply_stack, load_stack
from gpusim.workload.attention import Attention
from gpusim.workload.hf_config import transformer_from_hf
from gpusim.workload.numerics import Numerics
from gpusim.workload.rotary import ROPE_IMPLEMENTATIONS, rope_kernels
from gpusim.workload.zoo.transformer import TransformerConfig, build_transformer

BF16 = Numerics("bf16", "bf16", "bf16")


def _core(layer_list: list) -> Attention:
    return next(la for la in layer_list if isinstance(la, Attention))


def _rope_ops(layer: Attention, num: Numerics, backward: bool) -> list:
    ops = layer.backward_input(1, num) if backward else layer.forward(1, num)
    return [o for o in ops if "rope" in o.name]


@pytest.mark.parametrize(("impl", "forward", "backward"), [
    ("fused", 1, 1), ("complex", 3, 3), ("rotate_half", 5, 9), ("real_pairs", 9, 18)])
def test_each_implementation_runs_its_kernels_on_q_and_k(impl: str, forward: int,
                                                         backward: int) -> None:
    """Kernel counts from the frameworks' code (stacks/*.yaml cite it), per tensor; q and
    k each run them."""
    layer = Attention("a", heads=8, head_dim=64, seq=128, kv_heads=2, rotary_dim=64,
                      rope=impl)
    assert len(_rope_ops(layer, BF16, False)) == 2 * forward
    assert len(_rope_ops(layer, BF16, True)) == 2 * backward


def test_rope_bytes_follow_the_rotated_elements() -> None:
    """A fused kernel reads and writes each rotated element once in 16 bits; queries on
    every head, keys on the grouped heads as projected."""
    layer = Attention("a", heads=8, head_dim=64, seq=128, kv_heads=2, rotary_dim=64,
                      rope="fused")
    q, k = _rope_ops(layer, BF16, False)
    assert q.bytes == 8 * 128 * 64 * 2 * 2
    assert k.bytes == 2 * 128 * 64 * 2 * 2
    # torchtitan's complex product moves 20 bytes an element in 16 bits (cast up 2+4, the
    # complex product 4+4, cast back 4+2); on fp32 activations the casts do nothing
    assert sum(b for _, b, _ in rope_kernels("complex", 2, False)) \
        + sum(w for _, _, w in rope_kernels("complex", 2, False)) == 20
    assert len(rope_kernels("complex", 4, True)) == 1


def test_no_rotary_no_kernels_and_unknown_implementations_are_refused() -> None:
    layer = Attention("a", heads=8, head_dim=64, seq=128)
    assert not _rope_ops(layer, BF16, False)
    with pytest.raises(ValueError, match="rotary"):
        rope_kernels("sincos", 2, False)
    assert set(ROPE_IMPLEMENTATIONS) == {"fused", "complex", "rotate_half", "real_pairs"}


def test_latent_attention_rotates_its_rope_part_and_one_shared_key() -> None:
    core = _core(build_transformer(TransformerConfig(
        layers=1, hidden=512, heads=8, vocab=1000, seq_len=64, norm="rmsnorm",
        activation="swiglu", positions="rotary", kv_lora_rank=128, qk_nope_head_dim=32,
        qk_rope_head_dim=16, v_head_dim=32)).layers)
    q, k = _rope_ops(replace(core, rope="fused"), BF16, False)
    assert q.bytes == 8 * 64 * 16 * 4 and k.bytes == 1 * 64 * 16 * 4


def test_partial_rotary_and_positions_none() -> None:
    base = {"layers": 1, "hidden": 256, "heads": 4, "vocab": 1000, "seq_len": 32}
    full = _core(build_transformer(TransformerConfig(**base, positions="rotary")).layers)
    quarter = _core(build_transformer(TransformerConfig(
        **base, positions="rotary", rotary_fraction=0.25)).layers)
    none = _core(build_transformer(TransformerConfig(**base, positions="none")).layers)
    assert (full.rotary_dim, quarter.rotary_dim, none.rotary_dim) == (64, 16, 0)
    assert not any(la.name == "embed.positions"
                   for la in build_transformer(TransformerConfig(**base,
                                                                 positions="none")).layers)


def test_qk_norm_keeps_its_inputs_and_follows_the_stacks_norm() -> None:
    """Qwen3's per-head norms: two weights of head_dim, each keeping its input for
    backward (TE's RMSNorm saves it), written as the stack writes its RMS norms."""
    cfg: dict = {"layers": 1, "hidden": 256, "heads": 4, "kv_heads": 2, "head_dim": 64,
                 "vocab": 1000, "seq_len": 32, "norm": "rmsnorm", "activation": "swiglu",
                 "positions": "rotary"}
    plain = _core(build_transformer(TransformerConfig(**cfg)).layers)
    normed = _core(build_transformer(TransformerConfig(**cfg, qk_norm=True)).layers)
    assert normed.params == 128 and plain.params == 0
    assert normed.saved_bytes(1, BF16) - plain.saved_bytes(1, BF16) \
        == 32 * (4 + 2) * 64 * 2
    hf = _core(apply_stack(build_transformer(TransformerConfig(**cfg, qk_norm=True)),
                           load_stack("hf-transformers")).layers)
    assert hf.qk_norm_upcast == "cast_back" and hf.rope == "rotate_half"
    assert {o.family for o in hf.forward(1, BF16) if "norm" in o.name} == {"rms_norm_upcast"}
    te = _core(apply_stack(build_transformer(TransformerConfig(**cfg, qk_norm=True)),
                           load_stack("megatron")).layers)
    assert te.qk_norm_upcast == "" and te.rope == "fused"


def test_compiled_blocks_fuse_the_rotary_chain() -> None:
    model = build_transformer(TransformerConfig(layers=1, hidden=256, heads=4, vocab=1000,
                                                seq_len=32, positions="rotary"))
    eager = _core(apply_stack(model, load_stack("torchtitan")).layers)
    compiled = _core(apply_stack(model, load_stack("torchtitan").with_compile(True)).layers)
    assert (eager.rope, compiled.rope) == ("complex", "fused")


def test_hf_configs_say_which_families_rotate_part_of_a_head_or_norm_qk() -> None:
    qwen3 = transformer_from_hf({"model_type": "qwen3", "hidden_size": 256,
                                 "intermediate_size": 512, "num_hidden_layers": 2,
                                 "num_attention_heads": 4, "num_key_value_heads": 2,
                                 "head_dim": 64, "vocab_size": 1000}, "qwen3")
    assert qwen3.qk_norm
    neox = transformer_from_hf({"model_type": "gpt_neox", "hidden_size": 256,
                                "intermediate_size": 1024, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "vocab_size": 1000}, "neox")
    assert neox.rotary_fraction == 0.25 and not neox.qk_norm


def test_files_from_before_the_rotary_switch_predict_no_rotation(tmp_path: Path) -> None:
    """The runner applies rotary embeddings since its ``rotary`` switch; a file without it
    timed rotary models with no position encoding, and its cases say so when loaded."""
    spec = {"name": "tiny", "transformer": {"layers": 1, "hidden": 64, "heads": 2,
                                            "vocab": 100, "positions": "rotary"}}
    case = {"id": "tiny/fp32/b1", "model": spec}
    for switches, positions in (({}, "none"), ({"rotary": True}, "rotary")):
        path = tmp_path / f"models-{positions}.json"
        path.write_text(json.dumps({
            "schema_version": results.SCHEMA_VERSION, "suite": "models", "device": "x",
            "provenance": {}, "switches": switches, "cases": [case]}))
        loaded = results.load(path)["cases"][0]
        assert loaded["model"]["transformer"]["positions"] == positions


def test_the_runner_rotates_and_normalizes_q_and_k() -> None:
    """The measurement runner's attention applies what gpusim costs: QK norms with weights
    of their own and rotate_half, and its backward reaches the norms' weights."""
    torch = pytest.importorskip("torch")
    from gpusim.measure.torch_model import layer_module
    layer = Attention("a", heads=2, head_dim=8, seq=4, kv_heads=1, rotary_dim=8,
                      qk_norm=True, causal=True)
    module = layer_module(layer)
    qkv = torch.randn(1, 4, (2 + 2) * 8, requires_grad=True)
    out = module(qkv)
    out.sum().backward()
    assert out.shape == (1, 4, 16)
    assert module.q_norm.grad is not None and module.k_norm.grad is not None
    # the rotation is a rotation: position 0 is left as it is, norms are kept elsewhere
    x = torch.randn(1, 2, 4, 8)
    rotated = module._rotate(x)
    assert torch.allclose(rotated[..., 0, :], x[..., 0, :])
    assert torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
