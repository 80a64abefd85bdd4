"""Stepping the optimizer inside backward and offloading activations to the host, as
torchtune does them (issue 14): what each frees, what it refuses, what it costs in time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpusim.cli import main
from gpusim.errors import InvalidConfig
from gpusim.estimation import estimate, simulate_step
from gpusim.explore.values import with_fields
from gpusim.hardware.calibration import calibration_for
from gpusim.hardware.catalog import host_link, load_gpu
from gpusim.hardware.profile import GPUProfile
from gpusim.plan.job import TrainingJob
from gpusim.plan.lower import lower
from gpusim.plan.memory import memory_plan
from gpusim.plan.memory_report import memory_report
from gpusim.plan.remedies import remedies
from gpusim.validate.published_memory import load_cases
from gpusim.workload import zoo
from gpusim.workload.model import Model
from gpusim.workload.zoo.transformer import TransformerConfig, build_transformer

HIDDEN, VOCAB, SEQ, FFN = 256, 8000, 128, 1024


def _model(layers: int = 4) -> Model:
    return build_transformer(TransformerConfig(name=f"t{layers}", layers=layers, hidden=HIDDEN,
                                               heads=4, vocab=VOCAB, seq_len=SEQ,
                                               ffn_hidden=FFN))


def _job(h100: GPUProfile, layers: int = 4, micro: int = 8, **options: object) -> TrainingJob:
    """A small decoder in pure bf16 (AdamW, synthetic data)."""
    settings: dict[str, object] = {"precision": "bf16", "pure_bf16": True, "loader_workers": 0,
                                   "optimizer": "adamw", **options}
    return TrainingJob(_model(layers), h100, micro, **settings)  # type: ignore[arg-type]


def test_stepping_in_backward_keeps_only_the_largest_layers_gradients(
        h100: GPUProfile) -> None:
    plain = memory_plan(_job(h100))
    fused = memory_plan(_job(h100, optimizer_in_backward=True))
    # pure bf16: 2 bytes a gradient; the largest layer is the (tied) token table
    params = _model().parameters
    assert plain.gradients == 2 * params
    assert fused.gradients == 2 * VOCAB * HIDDEN
    # the foreach step's sqrt(v) is one tensor's, the token table's, not every parameter's
    assert plain.optimizer_temporaries == 2 * params
    assert fused.optimizer_temporaries == 2 * VOCAB * HIDDEN
    for same in ("weights", "optimizer_states", "activations", "transient"):
        assert getattr(fused, same) == getattr(plain, same)
    # no step after the backward pass holds every gradient: the peak is in backward, with
    # the one layer's gradients counted there
    assert fused.peak_phase == "backward"
    assert fused.breakdown()["gradients"] == 2 * VOCAB * HIDDEN


def test_offloading_activations_keeps_two_blocks_whatever_the_depth(h100: GPUProfile) -> None:
    """Under full recompute each block keeps its input (micro x seq x hidden, bf16): with
    offloading, blocks beyond the two in flight leave the GPU, so a deeper model keeps no
    more activations on it, and the bytes sent to the host grow by those blocks."""
    block_input = 8 * SEQ * HIDDEN * 2
    kept, host = {}, {}
    for layers in (4, 8):
        plain = memory_plan(_job(h100, layers, checkpointing="full"))
        off_job = _job(h100, layers, checkpointing="full", offload_activations=True)
        off = memory_plan(off_job)
        assert plain.activations - off.activations >= (layers - 2) * block_input
        for same in ("weights", "gradients", "optimizer_states", "transient"):
            assert getattr(off, same) == getattr(plain, same)
        kept[layers], host[layers] = off.activations, memory_report(off_job).offloaded_bytes
    assert kept[8] == kept[4]
    assert host[8] - host[4] == 4 * block_input


def test_offloading_activations_without_recompute_lowers_activations(h100: GPUProfile) -> None:
    plain = memory_plan(_job(h100, 8))
    off = memory_plan(_job(h100, 8, offload_activations=True))
    assert off.activations < plain.activations / 2
    # and the 4-block model keeps as much as the 8-block one: two blocks in flight
    assert memory_plan(_job(h100, 4, offload_activations=True)).activations == off.activations


@pytest.mark.parametrize(("options", "words"), [
    ({"optimizer_in_backward": True, "grad_accum": 2}, "--grad-accum 1"),
    ({"optimizer_in_backward": True, "offload": "optimizer"}, "--offload"),
    ({"optimizer_in_backward": True, "precision": "fp16", "pure_bf16": False}, "bf16"),
])
def test_stepping_in_backward_refuses_what_it_cannot_run(
        h100: GPUProfile, options: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidConfig, match=words) as err:
        _job(h100, **options)
    assert "\n" not in str(err.value)


def test_both_refuse_a_cpu_and_many_gpus() -> None:
    with pytest.raises(InvalidConfig, match="CPU"):
        estimate("gpt2", "epyc-9654", 8, precision="fp32", offload_activations=True)
    for flag in ("optimizer_in_backward", "offload_activations"):
        with pytest.raises(InvalidConfig, match="one GPU only"):
            estimate("gpt2", "h100-sxm", 16, num_gpus=2, **{flag: True})  # type: ignore[arg-type]


def test_stepping_in_backward_runs_the_same_work_inside_backward(h100: GPUProfile) -> None:
    plain, fused = lower(_job(h100)), lower(_job(h100, optimizer_in_backward=True))
    assert fused.optimizer == ()
    steps = [k for k in fused.microbatch if k.phase == "optimizer"]
    assert sum(k.bytes for k in steps) == pytest.approx(sum(k.bytes for k in plain.optimizer))
    # each layer's step right after its weight gradient: backward work follows the first
    phases = [k.phase for k in fused.microbatch]
    first = phases.index("optimizer")
    assert "backward" in phases[first:]
    result = simulate_step(_job(h100, optimizer_in_backward=True))
    assert result.breakdown_s["optimizer"] > 0
    assert result.step_time_s == pytest.approx(sum(result.breakdown_s.values()))


def test_slow_pcie_exposes_the_transfer_in_the_breakdown(h100: GPUProfile) -> None:
    """GPT-2 at batch 8 saves gigabytes a step; PCIe moves them far slower than the H100
    computes, so most of each trip shows, under its own name."""
    job = TrainingJob(zoo.get("gpt2"), h100, 8, "bf16", loader_workers=0,
                      offload_activations=True)
    step, plain = simulate_step(job), simulate_step(replace(job, offload_activations=False))
    exposed = step.breakdown_s["activation_offload"]
    link, cal = host_link(h100), calibration_for(h100)
    one_way = link.latency + memory_report(job).offloaded_bytes / (
        link.bandwidth * cal.pcie_efficiency)
    b = step.breakdown_s
    expected = (max(0.0, one_way - b["forward"])
                + max(0.0, one_way - b["backward"] - b["recompute"]))
    assert exposed == pytest.approx(expected) and exposed > 0.5 * plain.step_time_s
    assert step.step_time_s == pytest.approx(plain.step_time_s + exposed)
    assert step.step_time_s == pytest.approx(sum(b.values()))


def test_fast_pcie_hides_the_transfer(h100: GPUProfile) -> None:
    """Llama 3.2 3B at 2 x 4096 tokens computes far longer than its block inputs take."""
    job = TrainingJob(zoo.get("llama-3.2-3b", seq_len=4096), h100, 2, "bf16", pure_bf16=True,
                      loader_workers=0, checkpointing="full", offload_activations=True)
    assert simulate_step(job).breakdown_s["activation_offload"] == 0.0


def test_out_of_memory_advice_names_both(h100: GPUProfile) -> None:
    # gpt2-xl in pure bf16 on 15 GiB: the step's gradients and temporaries do not fit
    small = with_fields(load_gpu("a10"), {"memory_gib": 15})
    job = TrainingJob(zoo.get("gpt2-xl", seq_len=1024), small, 1, "bf16", pure_bf16=True,
                      loader_workers=0)
    assert not memory_plan(job).fits
    found = {r.kind: r for r in remedies(job)}
    step = found["step_in_backward"]
    assert step.fits and step.cli == "--optimizer-in-backward"
    assert step.api == "optimizer_in_backward=True"
    # activations dominate at a larger microbatch on a 24 GiB card: offloading them fits
    big = replace(job, device=load_gpu("a10"), batch_size=6)
    offload = {r.kind: r for r in remedies(big)}["activation_offload"]
    assert offload.fits and offload.cli == "--offload-activations"
    assert offload.api == "offload_activations=True"


def test_the_torchtune_cases_are_modelled() -> None:
    cases = {c.id: c for c in load_cases() if c.id.startswith("torchtune_llama32_3b")}
    for case_id, case in cases.items():
        fused = "optinbwd" in case_id
        offloaded = "actoffload" in case_id
        if fused or offloaded:
            assert case.job is not None, case.skipped
            assert case.job.optimizer_in_backward == fused
            assert case.job.offload_activations == offloaded


ARGS = ["--model", "gpt2", "--gpu", "h100-sxm", "--batch-size", "8", "--loader-workers", "0"]


def test_the_flags_run_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", *ARGS, "--optimizer-in-backward", "--offload-activations"]) == 0
    out = capsys.readouterr().out
    assert "activation offload" in out and "optimizer stepped inside backward" in out
    assert "activations offloaded" in out
    assert main(["memory", *ARGS, "--offload-activations"]) == 0
    assert "offloaded to the host" in capsys.readouterr().out


def test_the_flags_refuse_accumulation_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", *ARGS, "--optimizer-in-backward", "--grad-accum", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpusim: error:") and err.count("\n") == 1
    assert "--grad-accum 1" in err
