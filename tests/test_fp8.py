"""FP8 training as frameworks run it: only the linear layers' products in fp8, each
quantized tensor paying its scale and cast kernels, by recipe."""

from __future__ import annotations

from typing import Any

import pytest

from gpusim.errors import InvalidConfig
from gpusim.estimation import build_job, estimate
from gpusim.plan.job import TrainingJob
from gpusim.plan.lower import lower, microbatch_ops
from gpusim.workload.fp8 import FP8_RECIPES

LLAMA = {"model": "llama3-8b", "gpu": "h100-sxm", "batch_size": 1, "seq_len": 4096,
         "pure_bf16": False, "checkpointing": "full", "optimizer": "adamw8bit"}


def _job(recipe: str = "tensorwise") -> TrainingJob:
    job, _ = build_job(**{**LLAMA, "model": "gpt3-1.3b", "seq_len": 2048}, precision="fp8",
                       fp8_recipe=recipe)
    assert isinstance(job, TrainingJob)
    return job


def test_only_linear_layers_compute_in_fp8() -> None:
    ops = microbatch_ops(_job())
    fp8 = {op.name for op in ops if op.math == "fp8"}
    assert any(n.endswith("attn.qkv.fwd") for n in fp8)
    assert any(n.endswith("mlp.down.wgrad") for n in fp8)
    assert not any("head.vocab" in n for n in fp8)  # the output head stays bf16
    assert not any(op.kind == "attention" and op.math == "fp8" for op in ops)
    assert lower(_job()).microbatch  # and the job lowers and costs


@pytest.mark.parametrize("recipe", FP8_RECIPES)
def test_each_quantized_tensor_pays_its_cast_kernels(recipe: str) -> None:
    names = [op.name for op in microbatch_ops(_job(recipe)) if ".h.0.attn.qkv." in f".{op.name}"]
    casts = [n for n in names if "to_fp8" in n or n.endswith(".amax")]
    # x and w before the forward product, dy before the input gradient (recompute re-runs
    # the forward, so its casts appear twice)
    assert {n.split(".")[-2] for n in casts} >= {"x", "w", "dy"}
    if recipe == "tensorwise":
        assert any(n.endswith(".amax") for n in casts)
    if recipe in ("delayed", "blockwise"):
        assert not any(n.endswith(".amax") for n in casts)


def test_block_scaling_casts_both_layouts_in_one_kernel_with_its_scales() -> None:
    """Transformer Engine's Float8BlockScaling on Hopper (DeepSeek-V3's 1x128/128x128):
    one kernel reads the 16-bit tensor once and writes both fp8 layouts with an fp32 scale
    per 128 elements; no abs-max pass, so a step sits with delayed scaling's, below
    per-tensor scaling's."""
    from gpusim.workload.fp8 import quantize_ops
    from gpusim.workload.numerics import Numerics

    ops = quantize_ops("x", 2**20, Numerics("fp8", "bf16", "bf16", fp8_recipe="blockwise"))
    assert [op.name for op in ops] == ["x.to_fp8"]
    assert ops[0].bytes == 2 * 2**20 + 2 * 2**20 * (1 + 4 / 128)
    job = {**LLAMA, "batch_size": 16, "num_gpus": 8, "zero": 3, "seq_len": 8192,
           "microbatch_size": 2, "checkpointing": "per-op", "precision": "fp8"}
    times = {r: estimate(fp8_recipe=r, **job).step.step_time_s
             for r in ("tensorwise", "blockwise", "delayed")}
    assert times["blockwise"] < times["tensorwise"]
    assert times["blockwise"] == pytest.approx(times["delayed"], rel=0.01)


def test_fp8_speeds_a_large_model_up_by_a_published_like_factor() -> None:
    """Published FP8-over-BF16 training speedups run about 1.1-1.4x; counting every GEMM at
    the fp8 peak with no casts gave 1.45-1.62x."""
    job = {**LLAMA, "batch_size": 16, "num_gpus": 8, "zero": 3, "seq_len": 8192,
           "microbatch_size": 2, "checkpointing": "per-op"}
    bf16 = estimate(precision="bf16", **job).step.step_time_s
    fp8 = estimate(precision="fp8", **job).step.step_time_s
    delayed = estimate(precision="fp8", fp8_recipe="delayed", **job).step.step_time_s
    assert 1.1 < bf16 / fp8 < 1.4
    assert delayed < fp8  # no separate abs-max pass


def test_an_unknown_recipe_is_refused() -> None:
    with pytest.raises(InvalidConfig, match="unknown fp8 recipe 'int2'"):
        estimate(precision="fp8", fp8_recipe="int2", **LLAMA)


def test_transformer_engine_keeps_the_fp8_copy_of_a_linear_input() -> None:
    """Megatron-LM's Transformer Engine keeps a converted linear layer's input as fp8 (a
    byte an element) for the weight gradient; torchao's float8 keeps the bf16 input."""
    from gpusim.plan.memory import activations_by_layer
    from gpusim.plan.parallel_job import ParallelJob

    jobs = {}
    for stack in ("pytorch", "megatron"):
        job, _ = build_job("llama3-8b", "h100-sxm", 2, precision="fp8", seq_len=1024,
                           num_gpus=2, stack=stack)
        assert isinstance(job, ParallelJob)
        jobs[stack] = activations_by_layer(job.stage_job(job.model))[0]
    qkv = "h.0.attn.qkv"
    assert jobs["megatron"][qkv] == jobs["pytorch"][qkv] / 2
    assert jobs["megatron"]["h.0.attn.core"] == jobs["pytorch"]["h.0.attn.core"]


def test_sequence_parallel_gathers_move_fp8_inputs() -> None:
    """Column-parallel layers in fp8 gather their input already cast (torchao's
    Float8ColwiseParallel, Transformer Engine): fp8 moves less tensor-parallel traffic."""
    kw = {"num_gpus": 8, "tp": 8, "sequence_parallel": True, "microbatch_size": 1,
          "seq_len": 2048, "batch_size": 1}
    bf16 = estimate("llama3-8b", "h100-sxm", precision="bf16", **kw).step
    fp8 = estimate("llama3-8b", "h100-sxm", precision="fp8", **kw).step
    assert fp8.breakdown_s["tensor_parallel_comm"] < bf16.breakdown_s["tensor_parallel_comm"]


def test_experts_run_in_fp8_where_the_stack_runs_them_so() -> None:
    """Megatron-LM's experts are Transformer Engine GroupedLinear modules under fp8_autocast:
    their products run in fp8, quantizing each operand first, while the router stays bf16;
    torchtitan's grouped experts are no nn.Linear for torchao to convert: bf16."""
    def moe_ops(stack: str) -> list[Any]:
        job, _ = build_job(model="mixtral-8x7b", gpu="h100-sxm", batch_size=1, seq_len=1024,
                           precision="fp8", stack=stack)
        assert isinstance(job, TrainingJob)
        return [op for op in microbatch_ops(job) if ".moe." in op.name]

    megatron = {op.name.split(".moe.", 1)[1]: op for op in moe_ops("megatron")}
    assert megatron["experts_up"].math == megatron["experts_down_wgrad"].math == "fp8"
    assert megatron["router"].math == "bf16"
    assert {"experts_up.x.to_fp8", "experts_up.w.to_fp8", "experts_down.x.to_fp8",
            "experts_down.dy.to_fp8", "experts_up.dy.to_fp8"} <= set(megatron)
    torchtitan = moe_ops("torchtitan")
    assert all(op.math != "fp8" for op in torchtitan)
    assert not any("to_fp8" in op.name for op in torchtitan)


def test_a_lora_base_computes_in_fp8_but_a_qlora_base_does_not() -> None:
    # Transformer Engine runs every module under fp8_autocast and torchao converts modules,
    # not parameters that train: LoRA's frozen projections compute in fp8. QLoRA's 4-bit
    # base is dequantized to bf16 before its products.
    from gpusim.plan.autocast import layer_precisions

    def matmul_of(finetune: str) -> str:
        job = build_job("llama3-8b", "h100-sxm", 2, precision="fp8", seq_len=512,
                        finetune=finetune, lora_targets=("q", "v"))[0]
        assert isinstance(job, TrainingJob)
        return layer_precisions(job)["h.0.mlp.up"].numerics.matmul

    assert matmul_of("lora") == "fp8"
    assert matmul_of("qlora") == "bf16"
