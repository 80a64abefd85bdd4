"""LoRA and QLoRA fine-tuning (issue 19): adapters beside the targeted projections of a
frozen base; QLoRA holds the base's projections in 4-bit NF4."""

from __future__ import annotations

import pytest

from gpusim.cli import main
from gpusim.errors import InvalidConfig
from gpusim.estimation import build_job
from gpusim.plan.job import NF4_BYTES, TrainingJob
from gpusim.plan.lower import microbatch_ops
from gpusim.plan.memory import memory_plan
from gpusim.plan.optimizer_step import optimizer_ops
from gpusim.workload.lora import LORA_SUFFIX


def _job(finetune: str, **kw: object) -> TrainingJob:
    job, _ = build_job("llama2-7b", "a100-80gb", 1, precision="bf16", seq_len=512,
                       pure_bf16=True, finetune=finetune, **kw)  # type: ignore[arg-type]
    assert isinstance(job, TrainingJob)
    return job


def test_rank_8_on_q_and_v_trains_the_published_count() -> None:
    """PEFT's print_trainable_parameters for Llama-2 7B with r=8 on q_proj and v_proj:
    4,194,304 trainable of 6,742,609,920."""
    job = _job("lora", lora_rank=8, lora_targets=("q", "v"))
    trainable = sum(la.params for la in job.model.layers if job.is_trainable(la.name))
    assert trainable == 4_194_304
    base = sum(la.params for la in job.model.layers if not la.name.endswith(LORA_SUFFIX))
    assert base == 6_738_415_616  # 6,742,609,920 less the adapters


def test_only_the_adapters_have_gradients_and_optimizer_states() -> None:
    job = _job("lora")
    mem, full = memory_plan(job), memory_plan(_job("full"))
    adapters = sum(la.params for la in job.model.layers if la.name.endswith(LORA_SUFFIX))
    assert mem.gradients == pytest.approx(2 * adapters)  # pure bf16: bf16 gradients
    assert mem.optimizer_states == pytest.approx(4 * adapters)  # two bf16 moments
    assert mem.optimizer_states < full.optimizer_states / 1000
    names = {op.layer for op in optimizer_ops(job)}
    assert names == {"optimizer"} and len(optimizer_ops(job)) > 0
    wgrads = {op.layer for op in microbatch_ops(job) if "wgrad" in op.name}
    assert wgrads and all(name.endswith(LORA_SUFFIX) for name in wgrads)


def test_qlora_holds_the_projections_in_4_bits_and_dequantizes_them() -> None:
    lora, qlora = _job("lora"), _job("qlora")
    projections = sum(la.params for la in qlora.model.layers if qlora.quantized(la))
    saved = memory_plan(lora).weights - memory_plan(qlora).weights
    assert saved == pytest.approx(projections * (2 - NF4_BYTES))
    assert not qlora.quantized(next(la for la in qlora.model.layers
                                    if la.name == "head.vocab"))
    dequant = [op for op in microbatch_ops(qlora) if op.name.endswith("dequantize")]
    # before every forward product, and before every input gradient but the first block's
    # QKV, below the first adapter (nothing under it needs a gradient)
    assert len(dequant) == 2 * sum(1 for la in qlora.model.layers if qlora.quantized(la)) - 1


def test_lora_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--model", "llama2-7b", "--gpu", "rtx-4090", "--batch-size", "1",
                 "--seq-len", "512", "--precision", "bf16", "--pure-bf16", "--finetune",
                 "qlora", "--lora-rank", "16", "--lora-targets", "q,k,v,o"]) == 0
    out = capsys.readouterr().out
    assert "qlora: rank-16 adapters on 128 projections" in out
    assert main(["estimate", "--model", "llama2-7b", "--gpu", "h100", "--batch-size", "1",
                 "--finetune", "lora", "--lora-targets", "q,x"]) == 2
    assert "unknown LoRA target" in capsys.readouterr().err


def test_lora_needs_a_transformer() -> None:
    with pytest.raises(InvalidConfig, match="transformer"):
        build_job("resnet50", "h100-sxm", 8, finetune="lora")
