"""Memory as frameworks allocate it: FSDP's gathered units, frozen weights, recompute modes
and out-of-memory advice (issue 14)."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpusim.comm.topology import Topology
from gpusim.errors import InvalidConfig, OutOfMemory
from gpusim.estimation import build_job, estimate
from gpusim.hardware.profile import GPUProfile
from gpusim.plan.job import TrainingJob
from gpusim.plan.lower import microbatch_ops
from gpusim.plan.memory import ALLOCATOR_RESERVE, activations_by_layer, memory_plan
from gpusim.plan.memory_report import largest_microbatch
from gpusim.plan.parallel import plan_parallel
from gpusim.plan.parallel_job import ParallelConfig, ParallelJob
from gpusim.plan.recompute import parse_recompute
from gpusim.plan.remedies import combination, remedies
from gpusim.plan.stage_memory import stage_memory
from gpusim.workload import zoo
from gpusim.workload.formats import model_from_spec
from gpusim.workload.layers import Linear

GIB = 2.0**30


def _fsdp(model: str, gpus: int, micro: int, seq: int, recompute: str = "none",
          zero: int = 3) -> ParallelJob:
    topo = Topology.build("dgx-h100", gpus)
    return ParallelJob(zoo.get(model, seq_len=seq), topo, micro * gpus,
                       ParallelConfig(data=gpus, microbatch_size=micro, zero=zero), "bf16",
                       "adamw", recompute)


def _memory(job: ParallelJob):  # type: ignore[no-untyped-def]
    plan = plan_parallel(job)
    return stage_memory(plan, plan.stages[0])


def test_fsdp_keeps_no_unsharded_copy_of_the_weights() -> None:
    """Llama-3 70B on 64 H100s with full recompute: the issue saw 131 GiB of "weight
    copies"; FSDP holds 16 bytes a parameter over 64 ranks (16.4 GiB) plus gathered units."""
    job = _fsdp("llama3-70b", 64, 1, 8192, "full")
    mem = _memory(job)
    assert mem.weight_copies == 0
    params = job.model.parameters
    assert mem.weights + mem.gradients + mem.optimizer_states == pytest.approx(
        16 * params / 64)
    assert mem.fits
    assert mem.peak_bytes < 60 * GIB


def test_fsdp_gathers_units_in_the_compute_type() -> None:
    """Two units gathered in bf16 (running and prefetched) and one unit's bf16 gradient."""
    job = _fsdp("llama3-8b", 8, 1, 2048)
    mem = _memory(job)
    units: dict[str, int] = {}
    for la in job.model.layers:
        units[la.block] = units.get(la.block, 0) + la.params
    largest = max(units.values())  # the untied head (vocab x hidden) and the final norm
    assert largest == units["head"]
    base = memory_plan(job.stage_job(job.model))
    assert mem.gathered == pytest.approx(3 * 2 * largest)
    assert mem.transient == base.transient
    assert job.gathered_weight_bytes == 2


def test_fsdp_computes_every_layer_in_bf16() -> None:
    """FSDP's mixed precision casts weights when it gathers them, not per op: no autocast
    weight casts and no fp32 residual stream."""
    job = _fsdp("llama3-8b", 8, 1, 2048).stage_job(zoo.get("llama3-8b", seq_len=2048))
    ops = microbatch_ops(job)
    assert not [op for op in ops if op.name.endswith("cast_weight")]
    ddp = _fsdp("llama3-8b", 8, 1, 2048, zero=1).stage_job(zoo.get("llama3-8b", seq_len=2048))
    assert [op for op in microbatch_ops(ddp) if op.name.endswith("cast_weight")]
    assert memory_plan(job).activations < memory_plan(ddp).activations


def test_zero3_assumptions_name_fsdp_not_ddp() -> None:
    est = estimate("gpt2", "h100-sxm", 16, precision="bf16", num_gpus=8, system="dgx-h100",
                   zero=3)
    text = " ".join(est.assumptions)
    assert "FSDP" in text and "DDP" not in text
    ddp = estimate("gpt2", "h100-sxm", 16, precision="bf16", num_gpus=8, system="dgx-h100")
    assert "PyTorch DDP with autocast" in " ".join(ddp.assumptions)


def test_frozen_weights_are_held_in_the_compute_type(h100: GPUProfile) -> None:
    model = zoo.get("gpt2")
    frozen = TrainingJob(model, h100, 4, "bf16", frozen=("h.",))
    plain = TrainingJob(model, h100, 4, "bf16")
    body = sum(la.params for la in model.layers if la.name.startswith("h."))
    saved = memory_plan(plain).weights - memory_plan(frozen).weights
    assert saved == pytest.approx(2 * body)  # 4 bytes an fp32 weight, 2 a bf16 one
    body_linear = sum(la.params for la in model.layers
                      if la.name.startswith("h.") and isinstance(la, Linear))
    copies_saved = memory_plan(plain).weight_copies - memory_plan(frozen).weight_copies
    assert copies_saved == pytest.approx(2 * body_linear)
    assert not [op for op in microbatch_ops(frozen)
                if op.name.endswith("cast_weight") and op.layer.startswith("h.")]


def test_a_prefix_ending_in_a_dot_matches_the_layers_below_it(h100: GPUProfile) -> None:
    job = TrainingJob(zoo.get("gpt2"), h100, 4, "bf16", frozen=("h.",))
    assert not job.is_trainable("h.0.attn.qkv") and not job.is_trainable("h.11.mlp.down")
    assert job.is_trainable("embed.tokens")


@pytest.mark.parametrize("text, mode", [("full", "full"), ("Per-Op", "per-op"),
                                        ("every-k:2", "every-k:2"), ("every-k:1", "full"),
                                        ("block:5", "block:5"), ("block:0", "none")])
def test_recompute_modes_parse(text: str, mode: str) -> None:
    assert parse_recompute(text) == mode


@pytest.mark.parametrize("text", ["bogus", "every-k:0", "every-k:x", "every-k:", "block:x"])
def test_unknown_recompute_modes_are_refused_with_the_list(text: str) -> None:
    with pytest.raises(InvalidConfig, match=r"every-k|block:N"):
        parse_recompute(text)


def test_block_recompute_reruns_the_first_blocks_of_each_pipeline_chunk() -> None:
    # Megatron-LM's --recompute-method block --recompute-num-layers 2: in each of the 4
    # model chunks of 4 blocks, the first 2 re-run; time and memory sit between none and full
    def step(mode: str) -> tuple[float, float]:
        s = estimate(model="llama3-8b", gpu="h100-sxm", seq_len=2048, batch_size=16,
                     num_gpus=8, tp=2, pp=4, microbatch_size=1, precision="bf16",
                     stack="megatron", checkpointing=mode, schedule="interleaved",
                     virtual_stages=2).step
        return s.breakdown_s["recompute"], s.peak_memory_bytes

    none, block, full = step("none"), step("block:2"), step("full")
    assert none[0] == 0 < block[0] < full[0]
    assert block[0] == pytest.approx(full[0] / 2, rel=0.05)  # half of every chunk's blocks
    assert full[1] < block[1] < none[1]


def _llama_job(h100: GPUProfile, mode: str) -> TrainingJob:
    return TrainingJob(zoo.get("llama3-8b", seq_len=2048), h100, 1, "bf16",
                       checkpointing=mode, loader_workers=0, fsdp=True)


def test_recompute_modes_order_memory_and_time(h100: GPUProfile) -> None:
    """Between none and full, every-k and per-op each keep less and re-run more."""
    def kept(mode: str) -> float:
        return memory_plan(_llama_job(h100, mode)).activations

    def rerun(mode: str) -> float:
        return sum(op.flops for op in microbatch_ops(_llama_job(h100, mode))
                   if op.phase == "recompute")

    for middle in ("every-k:2", "per-op"):
        assert kept("none") > kept(middle) > kept("full")
        assert rerun("none") == 0 < rerun(middle) < rerun("full")


def test_flash_attention_keeps_no_scores_so_selective_is_nearly_none(h100: GPUProfile) -> None:
    """With FlashAttention there is no score matrix to drop: selective recompute saves only
    the kernel's output and row statistics (the output projection keeps its own copy)."""
    job = _llama_job(h100, "none")
    none = memory_plan(job).activations
    selective = memory_plan(_llama_job(h100, "selective")).activations
    core = next(la for la in job.model.layers if la.name == "h.0.attn.core")
    per_layer = core.out_elements * 2 + core.heads * core.seq * 4  # output, log-sum-exp
    assert none - selective == pytest.approx(32 * per_layer, rel=1e-6)
    assert selective > 0.95 * none


def test_flash_attention_output_is_kept_once(h100: GPUProfile) -> None:
    """FlashAttention writes its output as (batch, seq, heads, dim), so merging the heads is
    a view: no copy kernel runs, and the output projection keeps the kernel's own output
    (one tensor, counted once; its storage is what autograd saves for both). SDPA's cuDNN
    output is merged by a copy, and both tensors stay alive."""
    from gpusim.stack import apply_stack, load_stack

    def job(kernel: str, mode: str) -> TrainingJob:
        model = apply_stack(zoo.get("llama3-8b", seq_len=2048),
                            load_stack("pytorch").with_attention(kernel))
        return TrainingJob(model, h100, 1, "bf16", checkpointing=mode, loader_workers=0,
                           fsdp=True)

    core = next(la for la in job("flash2", "none").model.layers if la.name == "h.0.attn.core")
    out = core.out_elements * 2  # bf16, one sample
    flash, cudnn = memory_plan(job("flash2", "none")), memory_plan(job("cudnn", "none"))
    assert cudnn.activations - flash.activations == pytest.approx(32 * out, rel=1e-6)
    # selective recompute drops only the log-sum-exp once the output is the projection's
    lse = core.heads * core.seq * 4
    assert (flash.activations - memory_plan(job("flash2", "selective")).activations
            == pytest.approx(32 * lse, rel=1e-6))
    copies = [op.name for op in microbatch_ops(job("flash2", "none")) if "heads" in op.name]
    assert copies == [] and any("merge_heads" in op.name
                                for op in microbatch_ops(job("cudnn", "none")))


def test_per_op_saves_attention_and_every_other_product(h100: GPUProfile) -> None:
    ops = microbatch_ops(_llama_job(h100, "per-op"))
    rerun = {op.layer.split(".", 2)[-1] for op in ops
             if op.phase == "recompute" and op.layer.startswith("h.")}
    # qkv (1st product) and up (3rd) are saved, proj (2nd) and down (4th) re-run
    assert {"attn.proj", "mlp.down", "mlp.act", "norm1", "norm2"} <= rerun
    assert not rerun & {"attn.qkv", "attn.core", "mlp.up"}


def test_every_k_checkpoints_every_kth_block(h100: GPUProfile) -> None:
    ops = microbatch_ops(_llama_job(h100, "every-k:4"))
    blocks = {op.layer.split(".")[1] for op in ops if op.phase == "recompute"}
    assert blocks == {str(i) for i in range(3, 32, 4)}


def test_llama3_8b_fsdp_with_per_op_recompute_fits_at_8k() -> None:
    """The issue's case: microbatch 2 at sequence 8192 on 8 H100s under FSDP with PyTorch's
    per-op selective checkpointing trains in published runs; it was refused at 122 GiB."""
    mem = _memory(_fsdp("llama3-8b", 8, 2, 8192, "per-op"))
    assert mem.fits


def test_recompute_modes_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    from gpusim.cli import main
    assert main(["estimate", "--model", "gpt2", "--gpu", "h100-sxm", "--batch-size", "8",
                 "--precision", "bf16", "--recompute", "every-k:3", "--json"]) == 0
    capsys.readouterr()
    assert main(["estimate", "--model", "gpt2", "--gpu", "h100-sxm", "--batch-size", "8",
                 "--recompute", "sometimes"]) != 0
    err = capsys.readouterr().err
    assert "per-op" in err and "Traceback" not in err


def test_advice_leaves_out_what_cannot_work_when_states_alone_overflow() -> None:
    """Llama-3 70B's weights, gradients and Adam states need 1 TiB; no batch is small enough
    on 8 GPUs without sharding, so the advice must not suggest a smaller batch alone."""
    topo = Topology.build("dgx-h100", 8)
    job = ParallelJob(zoo.get("llama3-70b", seq_len=8192), topo, 8,
                      ParallelConfig(data=8, microbatch_size=1), "bf16")
    with pytest.raises(OutOfMemory) as err:
        estimate("llama3-70b", "h100-sxm", 8, precision="bf16", num_gpus=8,
                 system="dgx-h100", seq_len=8192)
    found = remedies(job)
    assert not [r for r in found if r.fits]
    combined = combination(job)
    assert combined and combined[0].kind == "zero" and combined[-1].fits
    text = str(err.value)
    assert "no single change fits" in text and "zero=3" in text
    assert "--zero" not in text  # the Python API names its own arguments


def test_advice_ranks_remedies_that_fit_cheapest_first() -> None:
    """Llama-3 8B at 8k on 8 H100s under ZeRO-1 (fp32 weights and gradients on every GPU):
    FSDP and tensor parallelism both fit, and sharding, which costs least, comes first."""
    topo = Topology.build("dgx-h100", 8)
    job = ParallelJob(zoo.get("llama3-8b", seq_len=8192), topo, 8,
                      ParallelConfig(data=8, microbatch_size=1, zero=1), "bf16")
    fitting = [r for r in remedies(job) if r.fits]
    kinds = [r.kind for r in fitting]
    assert kinds[0] == "zero" and "tensor" in kinds
    assert fitting[0].cli.startswith("--zero")
    for remedy in fitting:  # each one really fits when applied
        assert remedy.required_bytes < topo.gpu.memory_bytes


def test_the_cli_prints_flags_in_its_advice(capsys: pytest.CaptureFixture[str]) -> None:
    from gpusim.cli import main
    assert main(["estimate", "--model", "gpt2-xl", "--gpu", "a100-40gb", "--batch-size", "16",
                 "--precision", "bf16"]) == 2
    err = capsys.readouterr().err
    assert "--grad-accum" in err and "grad_accum=" not in err


def test_eight_bit_optimizer_states_take_a_quarter_of_adams(h100: GPUProfile) -> None:
    model = zoo.get("gpt2")
    adam = memory_plan(TrainingJob(model, h100, 4, "bf16", optimizer="adamw"))
    eight = memory_plan(TrainingJob(model, h100, 4, "bf16", optimizer="adamw8bit"))
    assert eight.optimizer_states == pytest.approx(adam.optimizer_states / 4, rel=0.01)


def test_largest_microbatch_is_the_edge_of_fitting(h100: GPUProfile) -> None:
    job = TrainingJob(zoo.get("gpt2-medium"), h100, 8, "bf16")
    largest = largest_microbatch(job)
    assert largest > 8
    assert memory_plan(replace(job, batch_size=largest)).fits
    assert not memory_plan(replace(job, batch_size=largest + 1)).fits


def test_max_batch_runs_the_largest_fitting_divisor_of_the_batch() -> None:
    est = estimate("gpt2-medium", "a100-40gb", 512, precision="bf16", max_batch=True)
    job, _ = build_job("gpt2-medium", "a100-40gb", 512, precision="bf16", max_batch=True)
    assert isinstance(job, TrainingJob)
    micro = job.microbatch_size
    assert 512 % micro == 0 and micro < 512
    assert memory_plan(job).fits
    assert not memory_plan(replace(job, grad_accum=job.grad_accum // 2)).fits
    assert f"microbatch {micro}" in est.assumptions[0]


def test_max_batch_on_a_parallel_job_picks_the_microbatch() -> None:
    job, _ = build_job("llama3-8b", "h100-sxm", 64, precision="bf16", seq_len=8192,
                       num_gpus=8, system="dgx-h100", zero=3, checkpointing="per-op",
                       max_batch=True)
    assert isinstance(job, ParallelJob)
    assert job.parallel.microbatch_size >= 1 and _memory(job).fits


def test_memory_command_prints_the_parts_and_the_largest_microbatch(
        capsys: pytest.CaptureFixture[str]) -> None:
    from gpusim.cli import main
    assert main(["memory", "--model", "llama3-8b", "--gpu", "h100-sxm", "--num-gpus", "8",
                 "--system", "dgx-h100", "--zero", "3", "--recompute", "per-op",
                 "--batch-size", "16", "--seq-len", "8192", "--precision", "bf16"]) == 0
    out = capsys.readouterr().out
    for part in ("peak allocated", "peak reserved", "optimizer states", "activations by "
                 "layer kind", "attention", "largest fitting", "peak at"):
        assert part in out
    assert main(["memory", "--model", "gpt2", "--gpu", "h100-sxm", "--batch-size", "8",
                 "--precision", "bf16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] and data["largest_microbatch"] > 8
    assert data["peak_reserved_bytes"] >= data["peak_allocated_bytes"]
    assert sum(data["activations_by_kind_bytes"].values()) == pytest.approx(
        data["breakdown_bytes"]["activations"], rel=1e-6)


def test_allocator_reserve_is_the_median_of_the_projects_runs() -> None:
    """The reserved-over-allocated fractions the memory plan states, recomputed from the
    measured runs they came from (cases of 1 GiB or more, by model family)."""
    root = Path(__file__).resolve().parents[1] / "measurements"
    ratios: dict[str, list[float]] = {"transformer": [], "cnn": []}
    for device in ("h100-sxm", "h200"):
        for case in json.loads((root / device / "models.json").read_text())["cases"]:
            if case["peak_memory_bytes"] < 2**30:
                continue
            family = model_from_spec(case["model"]).family
            ratios[family].append(case["peak_reserved_bytes"] / case["peak_memory_bytes"] - 1)
    for family, values in ratios.items():
        assert ALLOCATOR_RESERVE[family] == pytest.approx(statistics.median(values), abs=0.01)


def test_offloading_the_optimizer_frees_its_states_and_costs_pcie_time(
        h100: GPUProfile) -> None:
    model = zoo.get("gpt2-medium")
    plain = TrainingJob(model, h100, 4, "bf16", loader_workers=0)
    off = TrainingJob(model, h100, 4, "bf16", loader_workers=0, offload="optimizer")
    assert memory_plan(off).optimizer_states == 0 < memory_plan(plain).optimizer_states
    from gpusim.estimation import simulate_step
    from gpusim.plan.offload import CPU_ADAM_BYTES_PER_PARAM

    slow, fast = simulate_step(off), simulate_step(plain)
    extra = slow.breakdown_s["optimizer"] - fast.breakdown_s["optimizer"]
    # at least the gradients down and the weights up at PCIe 5's 64 GB/s, and the CPU's pass
    assert extra > model.parameters * (4 + 2) / 64e9
    assert extra < model.parameters * (4 + 2 + CPU_ADAM_BYTES_PER_PARAM) / 10e9


def test_fsdp_cpu_offload_keeps_only_gathered_units_on_the_gpu() -> None:
    job = _fsdp("llama3-8b", 8, 1, 2048)
    off = replace(job, offload="params")
    mem = _memory(off)
    assert mem.weights == mem.gradients == mem.optimizer_states == 0
    assert mem.transient > 0  # the gathered units
    with pytest.raises(InvalidConfig, match="--zero 3"):
        replace(_fsdp("llama3-8b", 8, 1, 2048, zero=1), offload="params")


def test_a_frozen_product_keeps_no_input(h100: GPUProfile) -> None:
    """x @ W with W frozen: autograd keeps W for the input gradient, not x. Freezing the
    MLPs of GPT-2 drops what their two products kept."""
    model = zoo.get("gpt2")
    plain = TrainingJob(model, h100, 4, "bf16")
    frozen = TrainingJob(model, h100, 4, "bf16",
                         frozen=tuple(f"h.{i}.mlp" for i in range(12)))
    kept = activations_by_layer(plain)[0]
    kept_frozen = activations_by_layer(frozen)[0]
    mlp = [la.name for la in model.layers if isinstance(la, Linear) and ".mlp." in la.name]
    assert all(kept[name] > 0 and kept_frozen[name] == 0 for name in mlp)


def test_fsdp_cpu_offload_brings_each_shard_up_before_its_gather() -> None:
    """Under --offload params the fp32 shard crosses PCIe before every gather (forward and
    backward), which a short pass cannot hide."""
    from gpusim.estimation import estimate

    base = {"model": "llama3-8b", "gpu": "h100-sxm", "batch_size": 8, "num_gpus": 8,
            "zero": 3, "seq_len": 512, "precision": "bf16"}
    states = estimate(**base, offload="optimizer").step
    params = estimate(**base, offload="params").step
    extra = params.breakdown_s["data_parallel_comm"] - states.breakdown_s["data_parallel_comm"]
    assert extra > 0.05 and params.step_time_s > states.step_time_s


def test_the_loss_and_a_recomputed_block_are_not_alive_together() -> None:
    """Backward frees the loss's buffers before it re-runs the last checkpointed block, so
    the start of backward holds the larger of the two, not both."""
    job, _ = build_job("llama3-8b", "h100-sxm", 1, precision="bf16", seq_len=4096,
                       checkpointing="full", stack="torchtitan")
    assert isinstance(job, TrainingJob)
    mem = memory_plan(job)
    assert mem.recompute_working > 0 and mem.loss_transient > 0
    kept = mem.activations - mem.recompute_working
    expected = kept + max(mem.loss_transient, mem.recompute_working + mem.transient)
    at_backward = mem.breakdown()
    assert mem.peak_phase == "backward"
    assert at_backward["activations"] + at_backward["transient"] == pytest.approx(expected)
    assert expected < kept + mem.recompute_working + mem.loss_transient


def test_megatrons_loss_turns_its_softmax_into_the_gradient_in_place() -> None:
    """Megatron-LM's vocab-parallel backward allocates only the bf16 cast of the gradient,
    where PyTorch's cross_entropy allocates two fp32 logits-sized gradients."""
    tokens, vocab = 4096, 128256
    torch_job, _ = build_job("llama3-8b", "h100-sxm", 1, precision="bf16", seq_len=tokens)
    megatron_job, _ = build_job("llama3-8b", "h100-sxm", 2, precision="bf16", seq_len=tokens,
                                num_gpus=2, stack="megatron")
    assert isinstance(torch_job, TrainingJob) and isinstance(megatron_job, ParallelJob)
    stage = megatron_job.stage_job(megatron_job.model)
    assert stage.master_weights
    assert memory_plan(torch_job).loss_transient == 2 * tokens * vocab * 4
    assert memory_plan(stage).loss_transient == tokens * vocab * 2


def _megatron(bf16_grads: bool, zero: int = 1) -> ParallelJob:
    topo = Topology.build("dgx-h100", 16)
    return ParallelJob(zoo.get("llama3-8b", seq_len=4096), topo, 64,
                       ParallelConfig(tensor=2, data=8, microbatch_size=1, zero=zero), "bf16",
                       "adamw", "full", bf16_grads=bf16_grads)


def _megatron_breakdown(term: str, **flags: Any) -> float:
    """One breakdown term of _megatron's job estimated end to end under ``flags``."""
    return estimate(model="llama3-8b", gpu="h100-sxm", seq_len=4096, batch_size=64,
                    num_gpus=16, tp=2, microbatch_size=1, zero=1, precision="bf16",
                    stack="megatron", checkpointing="full", **flags).step.breakdown_s[term]


def test_bf16_gradient_reduction_halves_megatrons_gradient_buffer_and_traffic() -> None:
    # Megatron-LM's --grad-reduce-in-bf16 (Megatron-Bridge's grad_reduce_in_fp32 false):
    # the gradient buffers take bf16, and the data-parallel reduce-scatter carries bf16
    fp32, bf16 = _megatron(False), _megatron(True)
    assert (fp32.whole.grad_bytes, fp32.whole.reduce_bytes) == (4, 4)
    assert (bf16.whole.grad_bytes, bf16.whole.reduce_bytes) == (2, 2)
    plans = [plan_parallel(j) for j in (fp32, bf16)]
    kept = [stage_memory(pl, pl.stages[0]).gradients for pl in plans]
    assert kept[1] == pytest.approx(kept[0] / 2)
    times = [_megatron_breakdown("data_parallel_comm", overlap_grad_reduce=False,
                                 bf16_grads=flag) for flag in (False, True)]
    assert 0.4 * times[0] < times[1] < 0.75 * times[0]


def test_fsdp_reducing_in_bf16_keeps_fp32_gradient_shards() -> None:
    # FSDP2's MixedPrecisionPolicy(reduce_dtype=bf16): the reduce-scatter carries bf16 and
    # the sharded gradient is cast back to the fp32 parameter's type
    job = replace(_fsdp("llama3-8b", 8, 1, 4096), bf16_grads=True)
    assert (job.whole.grad_bytes, job.whole.reduce_bytes) == (4, 2)
    assert any("reduce-scattered in bf16" in a for a in estimate(
        model="llama3-8b", gpu="h100-sxm", seq_len=4096, batch_size=8, num_gpus=8, zero=3,
        precision="bf16", bf16_grads=True).assumptions)


def test_bf16_gradient_reduction_needs_bf16_training(h100: GPUProfile) -> None:
    with pytest.raises(InvalidConfig, match="bf16 or fp8 training"):
        TrainingJob(zoo.get("gpt2-small"), h100, 8, "fp32", bf16_grads=True)


def test_bf16_gradient_reduction_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    from gpusim.cli import main
    assert main(["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--num-gpus", "16",
                 "--tp", "2", "--batch-size", "64", "--seq-len", "4096", "--precision", "bf16",
                 "--stack", "megatron", "--recompute", "full", "--zero", "1",
                 "--microbatch-size", "1", "--grad-reduce-in-bf16"]) == 0
    assert "gradients reduced in bf16" in capsys.readouterr().out


def test_bf16_optimizer_states_halve_the_states_and_the_master_copy(
        capsys: pytest.CaptureFixture[str]) -> None:
    # apex DistributedFusedAdam with dtype bf16 (NeMo's Nemotron-4 340B config): its copy of
    # the parameters and Adam's moments in bf16, 6 bytes a parameter where fp32 takes 12
    fp32 = _megatron(True)
    bf16 = replace(fp32, bf16_states=True)
    plans = [plan_parallel(j) for j in (fp32, bf16)]
    states = [stage_memory(pl, pl.stages[0]).optimizer_states for pl in plans]
    assert states[1] == pytest.approx(states[0] / 2)
    steps = [_megatron_breakdown("optimizer", bf16_grads=True, bf16_states=flag)
             for flag in (False, True)]
    assert steps[1] < 0.8 * steps[0]  # the update reads and writes half the bytes
    with pytest.raises(InvalidConfig, match="16-bit or fp8 training"):
        TrainingJob(zoo.get("gpt2-small"), fp32.topology.gpu, 8, "fp32", bf16_states=True)
    from gpusim.cli import main
    assert main(["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--num-gpus", "16",
                 "--tp", "2", "--batch-size", "64", "--seq-len", "4096", "--precision", "bf16",
                 "--stack", "megatron", "--recompute", "full", "--zero", "1",
                 "--microbatch-size", "1", "--bf16-optimizer-states"]) == 0
    assert "bf16 master copies and optimizer states" in capsys.readouterr().out


def test_megatron_mla_up_proj_and_mlp_recompute_modules(h100: GPUProfile) -> None:
    """Megatron-LM's mla_up_proj drops multi-head latent attention's up-projected q, k and v
    and re-runs the up-projections before the core's backward; mlp checkpoints a dense MLP
    whole, keeping its input. DeepSeek-V3's first three blocks are dense."""
    assert parse_recompute("selective:mlp+mla_up_proj") == "selective:mla_up_proj+mlp"
    model = zoo.get("deepseek-v3", seq_len=512)

    def job(mode: str) -> TrainingJob:
        return TrainingJob(model, h100, 1, "bf16", checkpointing=mode, loader_workers=0)

    def kept(mode: str) -> dict[str, float]:
        j = job(mode)
        from gpusim.plan.autocast import layer_precisions
        return activations_by_layer(j, layer_precisions(j))[0]

    none, up, mlp = kept("none"), kept("selective:mla_up_proj"), kept("selective:mlp")
    core = next(la for la in model.layers if la.name == "h.0.attn.core")
    num = job("none").numerics()
    assert none["h.0.attn.core"] - up["h.0.attn.core"] == pytest.approx(core.io_bytes(1, num))
    assert mlp["h.0.mlp.up"] == mlp["h.0.mlp.act"] == mlp["h.0.mlp.down"] == 0.0
    assert none["h.0.mlp.act"] > 0
    assert mlp["h.5.moe"] == none["h.5.moe"]  # mixtures of experts are not "mlp"
    reruns = {mode: [op.name for op in microbatch_ops(job(mode)) if op.phase == "recompute"]
              for mode in ("selective:mla_up_proj", "selective:mlp")}
    assert any(name.startswith("h.4.attn.q_up") for name in reruns["selective:mla_up_proj"])
    assert any(name.startswith("h.1.mlp.down") for name in reruns["selective:mlp"])
    assert not any(name.startswith("h.5.") for name in reruns["selective:mlp"])
