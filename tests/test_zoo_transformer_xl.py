"""Transformer-XL as NVIDIA DeepLearningExamples trains it (commit 729963dd4,
PyTorch/LanguageModeling/Transformer-XL/pytorch): its parameters counted from the code's
shapes, one block's FLOPs by hand, the memory's cost, and an estimate that runs."""

from __future__ import annotations

import pytest

from gpusim.estimation import estimate
from gpusim.workload import zoo
from gpusim.workload.numerics import FP32
from gpusim.workload.ops import Op
from gpusim.workload.zoo.transformer_xl import (
    TRANSFORMER_XLS,
    RelPartialAttention,
    TransformerXLConfig,
    build_transformer_xl,
)
from gpusim.workload.zoo.txl_softmax import AdaptiveSoftmax, zipf_fractions

BASE = TRANSFORMER_XLS["transformer-xl-base"]
V, CUTOFFS = 267735, (19997, 39997, 199997)


def _block_gemm_flops(model_layers: list, block: str, n: int) -> float:
    ops: list[Op] = [op for la in model_layers if la.block == block
                     for op in la.forward(n, FP32)]
    return sum(op.flops for op in ops if op.kind == "gemm")


def test_base_matches_wt103_base_yaml() -> None:
    cfg = BASE  # wt103_base.yaml: train section and manual_config
    assert (cfg.layers, cfg.d_model, cfg.heads, cfg.d_head, cfg.d_inner) == (16, 512, 8, 64,
                                                                             2048)
    assert (cfg.tgt_len, cfg.mem_len, cfg.div_val, cfg.vocab, cfg.cutoffs) == (
        192, 192, 1, V, CUTOFFS)
    assert (cfg.dropout, cfg.dropatt) == (0.1, 0.0)
    large = TRANSFORMER_XLS["transformer-xl-large"]  # wt103_large.yaml
    assert (large.layers, large.d_model, large.heads, large.d_head, large.d_inner,
            large.tgt_len, large.mem_len, large.div_val, large.dropatt) == (
        18, 1024, 16, 64, 4096, 384, 384, 4, 0.2)


def test_base_parameters_are_the_codes_shapes() -> None:
    """train.py logs sum(p.nelement() for p in model.parameters()); the README prints no
    count, so it is counted here from mem_transformer.py's and proj_adaptive_softmax.py's
    shapes (d_embed = d_model, so no projections; the softmax's weights are the tied
    table)."""
    d, hd, f = 512, 8 * 64, 2048
    block = (d * 3 * hd + d * hd + hd * d  # qkv_net, r_net, o_net (no biases)
             + 2 * d  # attention's LayerNorm
             + d * f + f + f * d + d + 2 * d)  # CoreNet's two Linears, FF LayerNorm
    expected = (V * d  # word_emb.emb_layers[0]
                + 16 * block
                + 2 * hd  # r_w_bias, r_r_bias
                + 3 * d + 3  # crit.cluster_weight, cluster_bias
                + V)  # crit.out_layers_biases[0]
    assert expected == 191_950_298
    assert zoo.get("transformer-xl-base").parameters == expected


def test_the_papers_base_dimensions_give_its_151m() -> None:
    """Dai et al. 2019, Table 1: Transformer-XL Standard on WikiText-103 has 151M
    parameters, with the reference implementation's base dimensions (DLE README's
    'Original setting' column: d_model 410, 10 heads of 41, d_inner 2100)."""
    original = TransformerXLConfig("original-base", 16, 410, 10, 41, 2100, 150, 150)
    assert build_transformer_xl(original).parameters == pytest.approx(151e6, rel=0.002)


def test_large_parameters_are_the_codes_shapes() -> None:
    """div_val 4: a table and a projection per cluster (d_embed // 4**i wide), tied between
    input and output except the head's own output projection (tie_projs[0] False)."""
    d, hd, f = 1024, 16 * 64, 4096
    sizes = [19997, 20000, 160000, V - 199997]
    dims = [1024, 256, 64, 16]
    block = d * 3 * hd + 2 * d * hd + 2 * d + d * f + f + f * d + d + 2 * d
    expected = (sum(s * e for s, e in zip(sizes, dims, strict=True))  # emb_layers
                + sum(d * e for e in dims)  # emb_projs
                + 18 * block + 2 * hd
                + 3 * d + 3 + V  # cluster weight and bias, per-cluster biases
                + d * dims[0])  # crit.out_projs[0]
    assert zoo.get("transformer-xl-large").parameters == expected == 285_167_482


def test_one_block_forward_flops_by_hand() -> None:
    """GEMM FLOPs of block 0 for a batch of n: q/k/v over all klen rows, r_net once for the
    batch over klen positions, AC, BD and the product with V over klen keys, o_net and the
    feed-forward over the tgt_len new tokens."""
    n, q, m, d, h, dh, f = 4, 192, 192, 512, 8, 64, 2048
    k, hd = q + m, h * dh
    by_hand = (2 * n * k * d * 3 * hd  # qkv_net(cat)
               + 2 * k * d * hd  # r_net(pos_emb), shared by the batch
               + 3 * 2 * n * h * q * k * dh  # AC, BD, attn_prob @ V
               + 2 * n * q * hd * d  # o_net
               + 2 * 2 * n * q * d * f)  # the two CoreNet Linears
    layers = list(zoo.get("transformer-xl-base").layers)
    assert _block_gemm_flops(layers, "layers.0", n) == by_hand
    # the elementwise work (softmax, masks, norms, copies) is a small part beside it
    everything = sum(op.flops for la in layers if la.block == "layers.0"
                     for op in la.forward(n, FP32))
    assert by_hand < everything < 1.03 * by_hand


def test_bd_and_the_rel_shift_are_costed_as_what_they_are() -> None:
    core = next(la for la in zoo.get("transformer-xl-base").layers
                if isinstance(la, RelPartialAttention))
    ops = {op.name.rsplit(".", 1)[-1]: op for op in core.forward(2, FP32)}
    # one product per head with the batch's queries stacked against the shared positions
    assert ops["bd"].gemm is not None
    assert (ops["bd"].gemm.m, ops["bd"].gemm.n, ops["bd"].gemm.batch) == (2 * 192, 384, 8)
    scores = 2 * 8 * 192 * 384
    shift = ops["rel_shift_pad"]
    assert shift.kind == "memory" and shift.flops == 0
    assert shift.bytes == 4 * (scores + scores + 2 * 8 * 192)  # read BD, write it padded
    assert ops["softmax"].bytes == 4 * 2 * scores  # over klen keys, not tgt_len


def test_memory_adds_key_value_work_but_no_tokens() -> None:
    n, q, m, d, hd, h, dh = 2, 192, 192, 512, 512, 8, 64
    with_mem = build_transformer_xl(BASE)
    without = build_transformer_xl(TransformerXLConfig("no-memory", 16, 512, 8, 64, 2048,
                                                       192, 0))
    assert with_mem.tokens_per_sample == without.tokens_per_sample == q
    assert with_mem.parameters == without.parameters
    extra = (2 * n * m * d * 3 * hd + 2 * m * d * hd + 3 * 2 * n * h * q * m * dh)
    gained = (_block_gemm_flops(list(with_mem.layers), "layers.3", n)
              - _block_gemm_flops(list(without.layers), "layers.3", n))
    assert gained == extra
    # backward flows through the projection of every klen row (the memory is detached, but
    # it is multiplied by this segment's weight, and autograd takes the whole cat's gradient)
    qkv = next(la for la in with_mem.layers if la.name == "layers.3.attn.qkv")
    wgrad, = qkv.backward_weight(n, FP32)
    assert wgrad.gemm is not None and wgrad.gemm.k == n * (q + m)


def test_tail_clusters_run_only_over_their_tokens() -> None:
    fractions = zipf_fractions(V, CUTOFFS)
    assert sum(fractions) == pytest.approx(1.0)
    assert fractions[0] == pytest.approx(0.8016, abs=1e-4)
    # the docstring's check against Grave et al.: 20% of a 10k vocabulary covers 83.6%
    assert zipf_fractions(10_000, (2_000,))[0] == pytest.approx(0.836, abs=1e-3)
    n, rows = 4, 192
    head_only = AdaptiveSoftmax("s", V, 512, 512, CUTOFFS, 1, rows, (1.0, 0.0, 0.0, 0.0))
    zipf = AdaptiveSoftmax("s", V, 512, 512, CUTOFFS, 1, rows, fractions)
    logits = {op.name: op.gemm for op in zipf.forward(n, FP32) if op.gemm is not None}
    assert logits["s.head_logits"] is not None
    assert (logits["s.head_logits"].m, logits["s.head_logits"].n) == (n * rows, 19997 + 3)
    c2 = logits["s.c2.logits"]
    assert c2 is not None and (c2.m, c2.n) == (round(fractions[2] * n * rows), 160000)
    gemm = [sum(op.flops for op in s.forward(n, FP32) if op.kind == "gemm")
            for s in (head_only, zipf)]
    # each tail's logits over its own tokens (head_only still runs each on one token)
    tails = sum(2 * (round(fr * n * rows) - 1) * size * 512
                for fr, size in zip(fractions[1:], (20000, 160000, V - 199997), strict=True))
    assert gemm[1] - gemm[0] == tails


def test_zoo_lists_them_and_takes_a_segment_length() -> None:
    assert {"transformer-xl-base", "transformer-xl-large"} <= set(zoo.names())
    assert zoo.get("txl-base").name == "transformer-xl-base"
    short = zoo.get("transformer-xl-base", seq_len=64)
    assert short.tokens_per_sample == 64
    qkv = next(la for la in short.layers if la.name == "layers.0.attn.qkv")
    assert qkv.rows == 64 + 192  # the memory keeps its length


@pytest.mark.parametrize(("name", "batch"), [("transformer-xl-base", 32),
                                             ("transformer-xl-large", 8)])
def test_estimates_on_a100_80gb(name: str, batch: int) -> None:
    result = estimate(name, "a100-80gb", batch, precision="bf16", loader_workers=0)
    step = result.step
    assert step.step_time_s > 0
    assert step.tokens_per_s == pytest.approx(step.samples_per_s * zoo.get(name).tokens_per_sample)
    assert 0 < step.peak_memory_bytes < 80e9
