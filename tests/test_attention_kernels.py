"""Attention kernels by name: each fitted on the micro suite's SDPA runs restricted to its
backend, chosen by the stack or --attention, with a note where a GPU has no measurement of
the kernel asked for."""

from __future__ import annotations

import pytest

from gpusim.errors import InvalidConfig
from gpusim.estimation import estimate
from gpusim.hardware.calibration import calibration_for
from gpusim.hardware.catalog import catalog
from gpusim.hardware.profile import DeviceProfile
from gpusim.stack import ATTENTION_KERNELS, apply_stack, load_stack, stack_names
from gpusim.workload import zoo
from gpusim.workload.attention import Attention

LLAMA = {"model": "llama3-8b", "batch_size": 1, "precision": "bf16", "pure_bf16": True,
         "optimizer": "adamw8bit", "checkpointing": "full", "seq_len": 8192}


def _h100() -> DeviceProfile:
    found = catalog().find("h100-sxm")
    assert isinstance(found, DeviceProfile)
    return found


def test_hopper_calibration_has_each_sdpa_backends_own_efficiency() -> None:
    cal = calibration_for(_h100())
    kernels = cal.gemm.attention_kernels
    assert {"flash2", "cudnn", "efficient"} <= set(kernels)
    # As measured on the H100 (PyTorch 2.11): cuDNN's kernel is about 1.7x FlashAttention-2,
    # which is about 2.4x the memory-efficient kernel, forward and backward alike.
    for phase in ("forward", "backward"):
        assert kernels["efficient"][phase] < kernels["flash2"][phase] < kernels["cudnn"][phase]
    assert 1.4 < kernels["cudnn"]["forward"] / kernels["flash2"]["forward"] < 2.0
    # SDPA's own choice there (the default kernel) is cuDNN's.
    assert cal.attention_efficiency("", False) == pytest.approx(
        kernels["cudnn"]["forward"], rel=0.05)


def test_the_kernel_changes_attention_time_and_math_its_memory() -> None:
    runs = {k: estimate(gpu="h100-sxm", attention=k, **LLAMA) for k in ATTENTION_KERNELS}
    step = {k: r.step.step_time_s for k, r in runs.items()}
    assert step["cudnn"] < step["flash2"] < step["efficient"]
    assert step["auto"] == pytest.approx(step["cudnn"], rel=0.02)
    memory = {k: r.step.peak_memory_bytes for k, r in runs.items()}
    assert memory["flash2"] == memory["cudnn"] == memory["auto"]
    # Math keeps the seq x seq scores for backward: under full recompute, in the one block
    # re-run at a time, which here peaks below the loss's backward (the logits' fp32
    # gradients), when no block is being re-run.
    assert memory["math"] >= memory["cudnn"]
    from gpusim.estimation import build_job
    from gpusim.plan.memory import memory_plan

    working = {k: memory_plan(build_job(gpu="h100-sxm", attention=k, **LLAMA)[0])
               .recompute_working for k in ("math", "cudnn")}
    assert working["math"] > working["cudnn"] + 32 * 8192**2  # the scores: 32 heads, 8K x 8K
    assert "flash2 attention" in " ".join(runs["flash2"].assumptions)


def test_an_unmeasured_kernel_is_costed_as_the_default_and_says_so() -> None:
    named = estimate(gpu="a100-80gb", attention="cudnn", **LLAMA)
    default = estimate(gpu="a100-80gb", **LLAMA)
    assert named.step.step_time_s == pytest.approx(default.step.step_time_s)
    assert any("no efficiency measured" in a and "cudnn" in a for a in named.assumptions)
    assert not any("no efficiency measured" in a for a in default.assumptions)


def test_every_stack_names_its_attention_kernel_with_a_source() -> None:
    for name in stack_names():
        stack = load_stack(name)
        assert stack.attention in ATTENTION_KERNELS
        assert stack.sources["attention"]
    model = apply_stack(zoo.get("gpt2"), load_stack("hf-transformers-2022"))
    attention = [la for la in model.layers if isinstance(la, Attention)]
    assert attention and not any(la.fused for la in attention)  # eager: matmul, softmax
    model = apply_stack(zoo.get("llama3-8b"), load_stack("torchtitan-2024"))
    assert {la.kernel for la in model.layers if isinstance(la, Attention)} == {"flash2"}


def test_an_unknown_kernel_is_refused() -> None:
    with pytest.raises(InvalidConfig, match="unknown attention kernel 'flash9'"):
        load_stack().with_attention("flash9")


def test_sliding_window_attention_counts_only_the_band() -> None:
    """Each query attends to its last w keys: s w - w (w - 1) / 2 pairs, and a fused kernel
    walks a band of tiles; Mistral's every block is windowed, Gemma 2's every other."""
    from gpusim.cost.kernels import attention_tiling
    from gpusim.workload import zoo
    from gpusim.workload.attention import Attention
    from gpusim.workload.numerics import Numerics

    num = Numerics("bf16", "bf16", "bf16")
    full = Attention("a", 32, 128, 8192, causal=True)
    band = Attention("a", 32, 128, 8192, causal=True, window=1024)
    fl = {a.window: sum(o.flops for o in a.forward(1, num) if o.kind == "attention")
          for a in (full, band)}
    pairs = 8192 * 1024 - 1024 * 1023 / 2
    assert fl[1024] == pytest.approx(4 * 32 * 128 * pairs)
    assert fl[0] == pytest.approx(4 * 32 * 128 * 8192**2 / 2)
    op = next(o for o in band.forward(1, num) if o.kind == "attention")
    assert op.attention is not None and 0.8 < attention_tiling(op.attention) <= 1.0
    windows = [la.window for la in zoo.get("gemma-2-9b").layers if isinstance(la, Attention)]
    assert windows[:4] == [4096, 0, 4096, 0]
    assert {la.window for la in zoo.get("mistral-7b").layers
            if isinstance(la, Attention)} == {4096}


def test_flashattentions_triton_kernel_runs_slower_than_flashattention_2() -> None:
    """FlashAttention's Triton kernel (llm-foundry's attn_impl triton): fitted on the A100
    figures of the FlashAttention-2 paper, stated for Hopper from that fit (no SDPA backend
    runs it, so our own suite cannot time it)."""
    for gpu in ("a100-80gb", "h100-sxm"):
        kernels = calibration_for(catalog().find(gpu)).gemm.attention_kernels  # type: ignore[arg-type]
        for phase in ("forward", "backward"):
            assert kernels["triton"][phase] < kernels["flash2"][phase]
        triton = estimate(gpu=gpu, attention="triton", **LLAMA)
        flash2 = estimate(gpu=gpu, attention="flash2", **LLAMA)
        assert triton.step.step_time_s > flash2.step.step_time_s
        assert not any("no efficiency measured" in a for a in triton.assumptions)


def test_fp32_attention_runs_the_efficient_kernels_fp32_products_whatever_the_tf32_flag() -> None:
    """On fp32 inputs SDPA has one fused kernel (FlashAttention and cuDNN take 16-bit only):
    the memory-efficient one, computing in fp32 whether TF32 is allowed or not, writing
    (batch, seq, heads, dim) so merging the heads is a view. Under autocast the kernel
    computes in the 16-bit type and the stated layout holds."""
    from gpusim.cost.kernels import FP32_ATTENTION, attention_key
    from gpusim.workload.numerics import Numerics

    att = Attention("attn", heads=12, head_dim=64, seq=1024, causal=True)
    for num in (Numerics("fp32", "tf32", "fp32"), Numerics("tf32", "tf32", "fp32")):
        ops = att.forward(2, num) + att.backward_input(2, num)
        fused = [op for op in ops if op.kind == "attention"]
        assert [op.math for op in fused] == ["fp32", "fp32"]
        assert {attention_key(op) for op in fused} == {FP32_ATTENTION}
        assert not any("merge_heads" in op.name or "split_heads" in op.name for op in ops)
        assert att.shared_output_bytes(2, num) == att.output_bytes(2, num) > 0
    bf16 = Numerics("bf16", "bf16", "bf16")
    ops = att.forward(2, bf16)
    assert [op.math for op in ops if op.kind == "attention"] == ["bf16"]
    assert any("merge_heads" in op.name for op in ops)


def test_hopper_fp32_attention_has_its_own_fit_and_the_named_kernel_says_what_runs() -> None:
    """The Hopper calibration fits fp32 attention on the H100's own fp32 SDPA timings
    (measurements/h100-sxm/micro-sdpa32.json), and a model in fp32 is costed by it: naming
    a 16-bit-only kernel changes nothing but a note saying SDPA's efficient kernel runs."""
    from gpusim.cost.kernels import FP32_ATTENTION

    cal = calibration_for(_h100())
    assert FP32_ATTENTION in cal.gemm.attention_kernels
    assert "measurements/h100-sxm/micro-sdpa32.json" in cal.fitted_on
    job = {"model": "gpt2", "batch_size": 4, "seq_len": 1024, "precision": "fp32"}
    auto = estimate(gpu="h100-sxm", **job)
    named = estimate(gpu="h100-sxm", attention="flash2", **job)
    assert named.step.step_time_s == pytest.approx(auto.step.step_time_s)
    assert any("takes 16-bit inputs only" in a for a in named.assumptions)
    assert not any("no efficiency measured" in a for a in auto.assumptions)
    # On an architecture without an fp32 attention fit, the default kernel's stands in,
    # and the estimate says so.
    ampere = estimate(gpu="a100-80gb", **job)
    assert any("fp32 attention: no efficiency measured" in a for a in ampere.assumptions)
