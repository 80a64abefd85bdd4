"""Mixtures of experts: routed expert MLPs, and expert parallelism's all-to-alls."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from gpusim.cli import main
from gpusim.errors import GpusimError, InvalidConfig
from gpusim.estimation import build_job, estimate
from gpusim.hardware.profile import GPUProfile
from gpusim.plan.parallel import plan_parallel
from gpusim.plan.parallel_job import ParallelJob
from gpusim.plan.stage_memory import stage_memory
from gpusim.plan.tensor_parallel import shard_layer
from gpusim.stack import load_stack
from gpusim.workload import zoo
from gpusim.workload.model import Model
from gpusim.workload.moe import MoE, ep_collectives
from gpusim.workload.numerics import Numerics
from gpusim.workload.zoo.transformer import TransformerConfig, build_transformer

BF16 = Numerics("bf16", "bf16", "bf16")


def _small_moe(experts: int = 8, top_k: int = 2) -> Model:
    return build_transformer(TransformerConfig(
        name="moe-small", layers=4, hidden=1024, heads=16, kv_heads=4, ffn_hidden=2816,
        vocab=32000, seq_len=2048, norm="rmsnorm", activation="swiglu", positions="rotary",
        bias=False, tied_embeddings=False, experts=experts, top_k=top_k))


def test_mixtral_counts_its_published_parameters_and_active_flops() -> None:
    mixtral = zoo.get("mixtral-8x7b")
    assert mixtral.parameters == pytest.approx(46.7e9, rel=0.005)  # Mistral AI: 46.7B
    # 12.9B parameters act on each token (Mistral AI): 6 x 12.9e9 FLOPs a token, plus
    # attention's scores
    seq = mixtral.tokens_per_sample or 1
    per_token = mixtral.training_flops_per_sample / seq
    # the embedding lookup multiplies nothing; causal attention adds 6 x layers x seq x hidden
    expected = 6 * (12.9e9 - 32000 * 4096) + 6 * 32 * seq * 4096
    assert per_token == pytest.approx(expected, rel=0.02)


def test_each_expert_computes_its_share_of_the_routed_tokens() -> None:
    moe = next(la for la in _small_moe().layers if isinstance(la, MoE))
    up = next(op for op in moe.forward(1, BF16) if op.name.endswith("experts_up"))
    assert up.gemm is not None
    assert (up.gemm.batch, up.gemm.m) == (8, 2048 * 2 // 8)  # 8 experts, 512 rows each
    # a rank holding 2 of 8 experts takes every rank's copies routed to them: as many rows
    held = MoE("m", 1024, 2816, 8, 2, 2048, local_experts=2)
    held_up = next(op for op in held.forward(1, BF16) if op.name.endswith("experts_up"))
    assert held_up.gemm is not None and held_up.gemm.batch == 2
    assert held_up.flops == pytest.approx(up.flops)
    assert held.expert_params * 4 == moe.expert_params
    assert [c for c, _ in ep_collectives(held, "backward", 1, 2)] == ["all_to_all"] * 2
    assert ep_collectives(moe, "forward", 1, 2) == []  # every expert at home: no exchange
    # tensor parallelism splits every expert's hidden size
    split = shard_layer(moe, 2, False)
    assert isinstance(split, MoE) and split.ffn == 2816 // 2


def _job(ep: int, zero: int = 1) -> ParallelJob:
    job, _ = build_job(_small_moe(), "h100-sxm", 8, precision="bf16", num_gpus=8, ep=ep,
                       zero=zero)
    assert isinstance(job, ParallelJob)
    return job


def test_expert_parallel_ranks_hold_a_share_of_the_experts() -> None:
    plain, split = plan_parallel(_job(1)), plan_parallel(_job(8))
    assert split.job.parallel.describe().endswith("EP 8, ZeRO-1")
    assert split.stages[0].params < plain.stages[0].params
    # ZeRO-1 over 8 ranks: the experts' states live on 8 / 8 = 1 rank each, so a rank keeps
    # all of its own experts' states and 1/8 of the rest: the same bytes either way
    states = [stage_memory(p, p.stages[0]).optimizer_states for p in (plain, split)]
    assert states[1] == pytest.approx(states[0], rel=1e-9)
    weights = [stage_memory(p, p.stages[0]).weights for p in (plain, split)]
    assert weights[1] < weights[0]  # without ZeRO-3, whole weights: only the held experts


def test_expert_parallelism_pays_its_all_to_alls() -> None:
    step = estimate(_small_moe(), "h100-sxm", 8, precision="bf16", num_gpus=8, ep=8).step
    assert step.breakdown_s["expert_parallel_comm"] > 0
    assert sum(step.breakdown_s.values()) == pytest.approx(step.step_time_s, rel=1e-6)
    one = estimate(_small_moe(), "h100-sxm", 1, precision="bf16").step
    assert one.model_flops_per_step * 8 == pytest.approx(step.model_flops_per_step, rel=1e-4)


def test_overlapped_all_to_alls_expose_only_what_compute_cannot_cover() -> None:
    plain = estimate(_small_moe(), "h100-sxm", 8, precision="bf16", num_gpus=8, ep=8)
    hidden = estimate(_small_moe(), "h100-sxm", 8, precision="bf16", num_gpus=8, ep=8,
                      ep_overlap=True)
    exposed = [r.step.breakdown_s["expert_parallel_comm"] for r in (plain, hidden)]
    assert exposed[1] < exposed[0]
    assert hidden.step.step_time_s < plain.step.step_time_s
    assert "EP all-to-alls overlapped" in hidden.step.parallel
    assert any("beside another microbatch's compute" in a for a in hidden.assumptions)
    with pytest.raises(InvalidConfig, match="needs --ep > 1"):
        build_job(_small_moe(), "h100-sxm", 8, precision="bf16", num_gpus=8, ep_overlap=True)
    # The compute the all-to-alls hide behind runs slower, as beside any collective (the
    # comm_slowdown term; none where it is switched off).
    kw = {"model": _small_moe(), "gpu": "h100-sxm", "batch_size": 8, "precision": "bf16",
          "num_gpus": 8, "ep": 8, "ep_overlap": True}
    assert hidden.step.breakdown_s["comm_slowdown"] > plain.step.breakdown_s["comm_slowdown"]
    free = estimate(**kw, comm_slowdown=0.0).step
    assert "comm_slowdown" not in free.breakdown_s
    assert free.step_time_s < hidden.step.step_time_s


@pytest.mark.parametrize(("model", "ep", "message"), [
    ("llama3-8b", 2, "no mixture of experts"),
    (None, 4, "do not split over EP 4"),
])
def test_expert_parallelism_refuses_what_it_cannot_split(model: str | None, ep: int,
                                                         message: str) -> None:
    with pytest.raises(InvalidConfig, match=message):
        build_job(model or _small_moe(experts=6), "h100-sxm", 8, precision="bf16",
                  num_gpus=8, ep=ep)


def test_cli_runs_a_shipped_moe_with_ep(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--num-gpus",
                 "8", "--ep", "8", "--zero", "3", "--seq-len", "4096", "--batch-size", "8",
                 "--precision", "bf16", "--recompute", "full"])
    out = capsys.readouterr().out
    assert code == 0 and "EP 8" in out and "expert parallel comm" in out


def test_expert_parallelism_can_fold_over_tensor_parallel_ranks() -> None:
    """Megatron-LM's MoE parallel folding: EP 32 over TP 2 x DP 16 leaves each expert whole
    (expert TP 1) on its rank, each rank routing its own sequence slice."""
    from gpusim.plan.parallel_job import ParallelConfig

    folded = ParallelConfig(tensor=2, data=16, expert=32, sequence_parallel=True)
    assert (folded.expert_tensor, folded.expert_data) == (1, 1)
    inside = ParallelConfig(tensor=2, data=16, expert=8, sequence_parallel=True)
    assert (inside.expert_tensor, inside.expert_data) == (2, 2)
    with pytest.raises(InvalidConfig, match="sequence-parallel"):
        ParallelConfig(tensor=2, data=16, expert=32)
    with pytest.raises(InvalidConfig, match="neither divides"):
        ParallelConfig(tensor=2, data=16, expert=64, sequence_parallel=True)
    job, _ = build_job(_small_moe(experts=16), "h100-sxm", 16, precision="bf16",
                       num_gpus=16, tp=2, ep=16, sequence_parallel=True, microbatch_size=1)
    assert isinstance(job, ParallelJob)
    moe = next(la for c in plan_parallel(job).stages[0].chunks for la in c.layers
               if isinstance(la, MoE))
    # every expert whole, one of the 16 on each rank, over the rank's half of the tokens
    assert (moe.ffn, moe.held, moe.rows) == (2816, 1, 2048 // 2)


def test_expert_tensor_parallelism_as_the_framework_sets_it() -> None:
    """--etp (Megatron-LM's --expert-tensor-parallel-size) below TP folds EP over tensor x
    data ranks even where EP fits inside DP: EP 8 over TP 4 x DP 2 on one node, each expert
    whole, where the default (expert TP = TP) strides EP across four nodes' worth of ranks."""
    from gpusim.plan.parallel_job import ParallelConfig
    from gpusim.plan.pass_cost import expert_group

    given = ParallelConfig(tensor=4, data=8, expert=8, expert_tensor_size=1,
                           sequence_parallel=True)
    assert (given.expert_tensor, given.expert_data) == (1, 4)
    derived = ParallelConfig(tensor=4, data=8, expert=8, sequence_parallel=True)
    assert (derived.expert_tensor, derived.expert_data) == (4, 1)
    with pytest.raises(InvalidConfig, match="--etp"):
        ParallelConfig(tensor=4, data=8, expert=8, expert_tensor_size=3, sequence_parallel=True)
    with pytest.raises(InvalidConfig, match="--etp"):
        ParallelConfig(tensor=4, data=4, expert=8, expert_tensor_size=4,
                       sequence_parallel=True)
    kw: dict[str, Any] = {"precision": "bf16", "num_gpus": 32, "tp": 4, "ep": 8,
                          "sequence_parallel": True, "microbatch_size": 1,
                          "system": "dgx-h100"}
    folded, _ = build_job(_small_moe(experts=16), "h100-sxm", 8, etp=1, **kw)
    spread, _ = build_job(_small_moe(experts=16), "h100-sxm", 8, **kw)
    assert isinstance(folded, ParallelJob) and isinstance(spread, ParallelJob)
    assert expert_group(folded).num_nodes == 1 < expert_group(spread).num_nodes
    moe = next(la for c in plan_parallel(folded).stages[0].chunks for la in c.layers
               if isinstance(la, MoE))
    assert (moe.ffn, moe.held, moe.rows) == (2816, 2, 2048 // 4)
    fast = estimate(_small_moe(experts=16), "h100-sxm", 8, etp=1, **kw).step
    slow = estimate(_small_moe(experts=16), "h100-sxm", 8, **kw).step
    assert (fast.breakdown_s["expert_parallel_comm"]
            < slow.breakdown_s["expert_parallel_comm"])


def test_model_chunks_can_hold_uneven_blocks() -> None:
    """--pp-layers per model chunk with virtual stages; the first and last chunks may hold
    only the embedding and the head (Megatron-LM's account_for_*_in_pipeline_split)."""
    job, _ = build_job("llama3-8b", "h100-sxm", 64, precision="bf16", num_gpus=8, pp=4,
                       schedule="interleaved", virtual_stages=2, microbatch_size=1,
                       pp_layers=(3, 4, 4, 5, 5, 4, 4, 3))
    assert isinstance(job, ParallelJob)
    plan = plan_parallel(job)
    assert len(plan.stages) == 4 and len(plan.stages[0].chunks) == 2
    edge, _ = build_job("llama3-8b", "h100-sxm", 64, precision="bf16", num_gpus=8, pp=4,
                        schedule="interleaved", virtual_stages=2, microbatch_size=1,
                        pp_layers=(0, 5, 5, 5, 5, 5, 5, 2))
    assert isinstance(edge, ParallelJob)
    with pytest.raises(InvalidConfig, match="first and last"):
        build_job("llama3-8b", "h100-sxm", 64, precision="bf16", num_gpus=8, pp=4,
                  schedule="interleaved", virtual_stages=2, microbatch_size=1,
                  pp_layers=(4, 0, 5, 5, 5, 5, 5, 3))


def test_search_tries_expert_parallelism_for_experts() -> None:
    from gpusim.comm.topology import Topology
    from gpusim.explore.search import candidates

    topo = Topology.build("dgx-h100", 8)
    eps = {c.expert for c, _ in candidates(_small_moe(), topo, 16)}
    assert eps == {1, 2, 4, 8}
    assert {c.expert for c, _ in candidates(zoo.get("gpt2"), topo, 16)} == {1}


def test_deepseek_v3_counts_its_published_total_and_active_parameters() -> None:
    """Multi-head latent attention, 3 dense blocks, 256 routed experts (top 8) and a shared
    one: 671B parameters, 37B active a token (DeepSeek-V3 report)."""
    v3 = zoo.get("deepseek-v3")
    assert v3.parameters == pytest.approx(671e9, rel=0.002)
    moes = [la for la in v3.layers if isinstance(la, MoE)]
    assert len(moes) == 61 - 3
    dense = sum(la.params for la in v3.layers if not isinstance(la, MoE))
    active = dense + sum(m.hidden * m.experts + 3 * m.shared_ffn * m.hidden
                         + m.top_k * 3 * m.ffn * m.hidden for m in moes)
    assert active == pytest.approx(37e9, rel=0.03)
    names = [la.name for la in v3.layers if la.block == "h.0" and "attn" in la.name]
    assert names[:5] == ["h.0.attn.q_down", "h.0.attn.q_norm", "h.0.attn.q_up",
                         "h.0.attn.kv_down", "h.0.attn.kv_norm"]


@pytest.mark.parametrize(("name", "active"), [("mixtral-8x7b", 12.9e9),
                                              ("mixtral-8x22b", 39e9),
                                              ("olmoe-1b-7b", 1.3e9),
                                              ("qwen3-30b-a3b", 3.3e9),
                                              ("deepseek-v3", 37e9)])
def test_active_parameters_are_the_published_ones(name: str, active: float) -> None:
    """Parameters a token computes with, as the model cards state them (Mixtral's 12.9B
    and 39B, OLMoE's 1.3B, Qwen3's A3B with its 3.3B, DeepSeek-V3's 37B)."""
    assert zoo.get(name).active_parameters == pytest.approx(active, rel=0.03)


def test_a_transformer_of_experts_from_the_command_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    dims = ["--layers", "4", "--hidden", "1024", "--heads", "16", "--ffn-hidden", "512",
            "--experts", "16", "--top-k", "4", "--mlp", "swiglu", "--vocab", "32000"]
    assert main(["models", "show", "transformer", *dims, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    expert = 3 * 1024 * 512
    assert info["parameters"] - info["active_parameters"] == 4 * (16 - 4) * expert
    assert main(["estimate", "--model", "transformer", *dims, "--gpu", "h100-sxm",
                 "--batch-size", "8", "--num-gpus", "8", "--ep", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["breakdown_s"]["expert_parallel_comm"] > 0


def test_megatron_recompute_modules_rerun_the_norm_and_activation_they_discard(
        h100: GPUProfile) -> None:
    """--recompute selective:layernorm+moe_act, as Megatron-Bridge's MoE recipes run it: the
    norm before each mixture of experts and the experts' activation give up their outputs
    and run again as the experts' backward starts; nothing else re-runs, nothing is
    exchanged again, and exactly those outputs leave the kept activations."""
    from gpusim.plan.autocast import layer_precisions
    from gpusim.plan.job import TrainingJob
    from gpusim.plan.lower import microbatch_ops, microbatch_steps
    from gpusim.plan.memory import activations_by_layer
    from gpusim.plan.recompute import parse_recompute

    assert parse_recompute("Selective:moe_act+layernorm") == "selective:layernorm+moe_act"
    assert parse_recompute("selective:core_attn") == "selective"
    with pytest.raises(InvalidConfig, match="moe_act"):
        parse_recompute("selective:shared_experts")  # a Megatron-LM module not modelled
    model = _small_moe()
    base = TrainingJob(model, h100, 4, "bf16")
    job = TrainingJob(model, h100, 4, "bf16", checkpointing="selective:layernorm+moe_act")
    layers = model.layers
    rerun = [layers[i].name for i, kind in microbatch_steps(job) if kind == "recompute"]
    moes = [la for la in layers if isinstance(la, MoE)]
    assert len(rerun) == 2 * len(moes)
    assert all(name.endswith(("norm2", "moe")) for name in rerun), rerun
    extra = [op.name for op in microbatch_ops(job) if op.phase == "recompute"]
    assert {name.rsplit(".", 1)[-1] for name in extra} <= {"act", "fwd"}
    kept_none, _ = activations_by_layer(base)
    kept, rerun_bytes = activations_by_layer(job)
    n, num = job.microbatch_size, layer_precisions(job)
    dropped = sum(n * moe.rows * moe.hidden * num[moe.name].numerics.act_bytes
                  + moe.activation_bytes(n, num[moe.name].numerics) for moe in moes)
    assert sum(kept_none.values()) - sum(kept.values()) == pytest.approx(dropped)
    assert rerun_bytes > 0
    # under expert parallelism, the activation's re-run exchanges nothing
    kw = {"model": model, "gpu": "h100-sxm", "batch_size": 64, "num_gpus": 8, "ep": 8,
          "microbatch_size": 1, "precision": "bf16"}
    plain = estimate(**kw).step.breakdown_s
    discarding = estimate(**kw, checkpointing="selective:moe_act").step.breakdown_s
    assert discarding["expert_parallel_comm"] == pytest.approx(plain["expert_parallel_comm"])
    assert discarding["recompute"] > 0 == plain["recompute"]


def test_megatron_moe_recompute_module_reruns_each_mixture_of_experts_whole(
        h100: GPUProfile) -> None:
    """--recompute selective:moe (Megatron-LM's recompute module moe: the MLP under a
    checkpoint): each mixture of experts keeps only its input and runs again whole before
    its backward, dispatch and combine included; with layernorm as well, the norm re-creates
    that input too, so nothing of the layer is kept."""
    from gpusim.plan.autocast import layer_precisions
    from gpusim.plan.job import TrainingJob
    from gpusim.plan.lower import microbatch_ops, microbatch_steps
    from gpusim.plan.memory import activations_by_layer
    from gpusim.plan.recompute import parse_recompute

    assert parse_recompute("selective:moe+layernorm") == "selective:layernorm+moe"
    model = _small_moe()
    moes = [la for la in model.layers if isinstance(la, MoE)]
    job = TrainingJob(model, h100, 4, "bf16", checkpointing="selective:moe")
    rerun = [model.layers[i].name for i, kind in microbatch_steps(job) if kind == "recompute"]
    assert rerun == [moe.name for moe in reversed(moes)]
    again = {op.name.rsplit(".", 1)[-1] for op in microbatch_ops(job) if op.phase == "recompute"}
    assert again > {"act"}  # the whole layer, not its activation alone
    kept_none, _ = activations_by_layer(TrainingJob(model, h100, 4, "bf16"))
    kept, rerun_bytes = activations_by_layer(job)
    num = layer_precisions(job)
    for moe in moes:
        assert kept[moe.name] == 4 * moe.rows * moe.hidden * num[moe.name].numerics.act_bytes
        assert kept[moe.name] < kept_none[moe.name]
    assert rerun_bytes == pytest.approx(max(kept_none[moe.name] for moe in moes))
    both, _ = activations_by_layer(
        TrainingJob(model, h100, 4, "bf16", checkpointing="selective:layernorm+moe"))
    assert all(both[moe.name] == 0 for moe in moes)
    # under expert parallelism, the re-run exchanges its tokens again
    kw = {"model": model, "gpu": "h100-sxm", "batch_size": 64, "num_gpus": 8, "ep": 8,
          "microbatch_size": 1, "precision": "bf16"}
    plain = estimate(**kw).step.breakdown_s
    whole = estimate(**kw, checkpointing="selective:moe").step.breakdown_s
    assert whole["expert_parallel_comm"] > plain["expert_parallel_comm"]
    assert whole["recompute"] > 0 == plain["recompute"]

def test_fp8_experts_keep_one_byte_copies_of_their_inputs() -> None:
    """Under fp8 with Transformer Engine (Megatron's stack), the experts' GroupedLinear keeps
    the quantized copies of its inputs for the weight gradient, as its Linear does
    (transformer_engine/pytorch/module/grouped_linear.py @d0067d0da: the saved inputmats
    keep their column-wise fp8 data): the permuted copies and the activation a byte each."""
    from gpusim.hardware.catalog import load_gpu
    from gpusim.plan.autocast import layer_precisions
    from gpusim.plan.job import TrainingJob
    from gpusim.plan.memory import activations_by_layer
    from gpusim.stack import load_stack

    megatron = load_stack("megatron")
    assert megatron.fp8_saved_input == "fp8" and megatron.fp8_experts
    high = megatron.model_copy(update={"fp8_saved_input": "high"})
    h100 = load_gpu("h100-sxm")
    # Megatron's bf16 model with fp32 master copies, on one GPU as in its parallel jobs
    one, _ = build_job(_small_moe(), "h100-sxm", 2, precision="fp8", stack="megatron")
    assert isinstance(one, TrainingJob) and one.master_weights
    jobs = [TrainingJob(_small_moe(), h100, 2, "fp8", stack=stack, master_weights=True)
            for stack in (megatron, high)]
    kept_fp8, kept_high = (activations_by_layer(job)[0] for job in jobs)
    moe = next(la for la in jobs[0].model.layers if isinstance(la, MoE))
    num = layer_precisions(jobs[0])[moe.name].numerics
    assert num.activation == "bf16" and num.matmul == "fp8"  # Megatron's bf16 model
    assert kept_high[moe.name] - kept_fp8[moe.name] == pytest.approx(
        moe.product_input_bytes(2, num) / 2)


def test_autocast_casts_a_mixture_of_experts_weights_as_a_linear_layers(h100: GPUProfile
                                                                         ) -> None:
    """Under autocast the router's and experts' fp32 weights are cast to bf16 each forward and
    their gradients back up in backward (an H100 profile of the models suite's MoE layer:
    1.2 ms each way for 604M parameters); Megatron-style master weights cast nothing."""
    from gpusim.plan.job import TrainingJob
    from gpusim.plan.lower import microbatch_ops
    from gpusim.plan.memory import memory_plan

    model = zoo.get("mixtral-8x7b", seq_len=512)
    moe = next(la for la in model.layers if isinstance(la, MoE))
    job = TrainingJob(model, h100, 1, "bf16")
    every = microbatch_ops(job)
    ops = {op.name: op for op in every if op.layer == moe.name}
    weight, grad = ops[f"{moe.name}.cast_weight"], ops[f"{moe.name}.cast_grad"]
    assert weight.phase == "forward" and grad.phase != "forward"
    assert weight.bytes == moe.params * (4 + 2)  # fp32 read, bf16 written
    linear = next(op for op in every if op.name.endswith(".cast_grad") and op.layer != moe.name)
    linear_params = next(la.params for la in model.layers if la.name == linear.layer)
    assert grad.bytes / moe.params == linear.bytes / linear_params  # as a linear layer's
    copies = sum(la.params for la in model.layers if la.params and not la.name.startswith(
        ("embed", "norm")) and "norm" not in la.name) * 2
    assert memory_plan(job).weight_copies == pytest.approx(copies)
    megatron = TrainingJob(model, h100, 1, "bf16", master_weights=True)
    assert not [op for op in microbatch_ops(megatron) if op.name.endswith("cast_weight")]


def test_expected_destinations_count_distinct_ranks_or_nodes() -> None:
    from gpusim.workload.moe import expected_destinations
    # one expert per unit: every pick a unit of its own
    assert expected_destinations(8, 8, 2) == pytest.approx(2.0)
    # all experts on one unit of eight picked: 1 - C(7e, k) / C(8e, k) of them each
    assert expected_destinations(8, 256, 8) == pytest.approx(5.29, abs=0.01)
    # DeepSeek-V3's 4-of-8 node-limited routing, as DeepEP's own tests count it
    assert expected_destinations(8, 256, 8, 4) == pytest.approx(3.63, abs=0.01)
    assert expected_destinations(2, 4, 8) == 2.0  # more picks than units


def test_deepep_sends_a_token_once_per_destination() -> None:
    """DeepEP dispatches a token once per destination rank inside a node and once per node
    across nodes (forwarded over NVLink there), where NCCL's all-to-all sends a copy per
    chosen expert; DeepSeek-V3's group-limited routing bounds the nodes at 4 of 8."""
    moe = MoE("m", 7168, 2048, 256, 8, rows=4096, local_experts=4, groups=8,
              groups_per_token=4)
    plain = ep_collectives(moe, "backward", 1, 2)[0][1]
    assert plain == 4096 * 8 * 7168 * 2
    across = ep_collectives(moe, "forward", 1, 2, dedup_units=8)[0][1]
    assert across == pytest.approx(plain / 8 * 3.629, rel=1e-3)
    free = ep_collectives(replace(moe, groups=0, groups_per_token=0), "forward", 1, 2,
                          dedup_units=8)[0][1]
    assert across < free < plain
    # on a whole job: the all-to-alls of DeepSeek-V3 over 64 ranks on 8 nodes shrink
    base: dict[str, Any] = {
        "model": "deepseek-v3", "gpu": "h100-sxm", "seq_len": 4096, "batch_size": 512,
        "num_gpus": 512, "pp": 8, "pp_layers": (7, 7, 8, 8, 8, 8, 8, 7), "ep": 64,
        "microbatch_size": 1, "precision": "bf16", "stack": "megatron", "zero": 1,
        "checkpointing": "full"}
    comm = {d: estimate(**base, ep_dispatcher=d).step.breakdown_s["expert_parallel_comm"]
            for d in ("alltoall", "deepep")}
    assert comm["deepep"] < 0.7 * comm["alltoall"]
    # NVIDIA's HybridEP is hierarchical the same way (RDMA across nodes, NVLink inside)
    hybrid = estimate(**base, ep_dispatcher="hybridep").step
    assert hybrid.breakdown_s["expert_parallel_comm"] == pytest.approx(comm["deepep"])
    assert "hybridep dispatch" in hybrid.parallel
    with pytest.raises(InvalidConfig, match="dispatcher"):
        estimate(**base, ep_dispatcher="nccl")


def test_multi_token_prediction_adds_a_block_that_shares_the_output_head() -> None:
    """DeepSeek-V3's multi-token prediction (its config's num_nextn_predict_layers 1): one
    more mixture-of-experts block with the projection before it, on the last pipeline
    stage, predicting through the output head it shares. The technical report's 14B counts
    the module's own embedding and head copies (2 x 129,280 x 7,168) besides these."""
    import yaml

    from gpusim.data import data_dir
    from gpusim.plan.parallel import tied_embedding_params
    from gpusim.workload.hf_config import transformer_from_hf

    data = yaml.safe_load((data_dir("models") / "deepseek-v3.yaml").read_text())
    cfg = transformer_from_hf(data["hf_config"], "deepseek-v3", "deepseek-v3", 512)
    plain = build_transformer(cfg)
    mtp = build_transformer(cfg.model_copy(update={"mtp_layers": 1}))
    extra = mtp.parameters - plain.parameters
    assert extra == pytest.approx(11.61e9, rel=1e-3)
    assert extra + 2 * 129280 * 7168 == pytest.approx(14e9, rel=0.05)
    head = next(la for la in mtp.layers if la.name == "mtp.0.head")
    assert head.shared and head.tied_to == "head.vocab" and head.params == 0
    assert len(mtp.partition()[1]) == 61  # the body keeps its 61 blocks; MTP is the tail's
    job = build_job(mtp, "h100-sxm", 64, precision="bf16", system="dgx-h100", num_gpus=64,
                    pp=8, ep=8, microbatch_size=1, pp_layers=(7, 7, 8, 8, 8, 8, 8, 7),
                    stack="megatron")[0]
    assert isinstance(job, ParallelJob)
    assert tied_embedding_params(job) == 0  # untied: nothing to all-reduce across stages


def test_transformer_engine_runs_each_experts_product_as_its_own_gemm() -> None:
    """Megatron-LM's experts are Transformer Engine GroupedLinear modules: on Hopper one
    cuBLAS GEMM per expert, round-robin on 4 streams, and each operand cast expert by
    expert in fp8; torch._grouped_mm (the default stack) is one kernel per product."""
    from gpusim.cost.kernels import kernel_cost, op_host_extra
    from gpusim.hardware.calibration import calibration_for
    from gpusim.hardware.catalog import load_gpu
    from gpusim.stack import apply_stack

    model = _small_moe(experts=128, top_k=8)

    def moe_of(stack: str) -> MoE:
        layer = next(la for la in apply_stack(model, load_stack(stack)).layers
                     if isinstance(la, MoE))
        return replace(layer, local_experts=16)

    te, plain = moe_of("megatron"), moe_of("pytorch")
    fp8 = Numerics("fp8", "bf16", "bf16")
    ops = {o.name.rsplit(".", 1)[-1]: o for o in te.forward(1, fp8)}
    up = ops["experts_up"]
    assert (up.launches, up.streams) == (16, 4)
    assert all(o.launches == 16 for o in te.forward(1, fp8) if ".experts_" in o.name)
    assert ops["permute"].syncs  # the token counts read back before the dispatch
    assert not any(o.launches > 1 or o.syncs for o in plain.forward(1, fp8))
    gpu = load_gpu("h100-sxm")
    cal = calibration_for(gpu).sustained()
    # four rounds of four experts' GEMMs side by side, against one grouped kernel
    whole = replace(up, launches=1, streams=1)
    assert up.gemm is not None
    four = replace(whole, flops=whole.flops / 4, bytes=whole.bytes / 4,
                   alloc_bytes=whole.alloc_bytes / 4, written=whole.written / 4,
                   gemm=replace(up.gemm, batch=4))
    assert kernel_cost(up, gpu, cal).seconds == pytest.approx(
        4 * kernel_cost(four, gpu, cal).seconds)
    assert kernel_cost(up, gpu, cal).seconds > kernel_cost(whole, gpu, cal).seconds
    # the host launches every expert's GEMM through cuBLASLt
    o = cal.overhead
    assert op_host_extra(up, cal) == pytest.approx(
        (16 * (o.cublas_us + o.scaled_mm_us) + 15 * o.launch_us) * 1e-6)


def test_a_host_that_waits_for_the_device_loses_its_lead() -> None:
    """Before a kernel that syncs, the host waits for the device to drain its queue, so the
    device then idles while the host dispatches what follows."""
    from gpusim.plan.pass_cost import Queue

    host, device = [1.0, 1.0, 1.0, 1.0], [3.0, 0.5, 0.5, 0.5]
    assert Queue().run(host, device) == pytest.approx(1.0)  # only the first dispatch
    # waiting before the third kernel: the device idles for its dispatch too
    assert Queue().run(host, device, (False, False, True, False)) == pytest.approx(2.5)


def test_megatron_moe_steps_pay_their_per_expert_launches_and_syncs() -> None:
    base: dict[str, Any] = {
        "model": _small_moe(experts=64, top_k=8), "gpu": "h100-sxm", "batch_size": 64,
        "num_gpus": 8, "ep": 8, "microbatch_size": 1, "precision": "bf16", "zero": 1}
    megatron = load_stack("megatron")
    grouped = megatron.model_copy(update={"expert_streams": 0, "moe_host_sync": "never"})
    unsynced = megatron.model_copy(update={"moe_host_sync": "never"})
    runs = [estimate(**base, stack=s) for s in (grouped, unsynced, megatron)]
    times = [r.step.step_time_s for r in runs]
    assert times[0] < times[1] < times[2]
    said = runs[2].assumptions[0]
    assert "one cuBLAS GEMM per expert, 4 streams at a time" in said
    assert "the host waiting for each MoE layer's tokens per expert" in said
    assert "per expert" not in runs[0].assumptions[0]
    # the validated gap is said where it applies, not hidden in a factor
    assert any(a.startswith("known gap: Megatron-Core mixtures of experts")
               for a in runs[2].assumptions)
    # on one device the engine's host waits at each sync, as the queue above does
    one = {s.moe_host_sync: estimate(_small_moe(experts=64, top_k=8), "h100-sxm", 8,
                                     precision="bf16", stack=s).step
           for s in (unsynced, megatron)}
    assert one["always"].step_time_s > one["never"].step_time_s


def test_an_all_to_alls_tokens_are_sorted_by_local_expert_and_back() -> None:
    """Over a plain all-to-all the copies a rank receives come grouped by sending rank;
    with several local experts they are sorted by expert before the experts' products and
    back after (Megatron-LM's permutation 2, torchtitan's _permute): a pass over them each
    way, in forward and backward. DeepEP and HybridEP hand tokens over per token, one local
    permute groups them; a rank of one expert needs no sort."""
    from gpusim.plan.expert_parallel import hold_experts
    moe = MoE("m", 2048, 768, 128, 8, rows=4096)
    a2a = hold_experts(moe, 16)
    sorts = [o for o in a2a.forward(1, BF16) + a2a.backward_input(1, BF16)
             if "sort" in o.name]
    assert [o.name.split(".")[-1] for o in sorts] == [
        "sort_by_expert", "unsort", "unsort_bwd", "sort_by_expert_bwd"]
    assert all(o.bytes == 2 * 4096 * 8 * 2048 * 2 for o in sorts)
    assert not hold_experts(moe, 16, all_to_all=False).sorts_by_expert
    assert not hold_experts(moe, 128).sorts_by_expert  # one expert a rank
    assert not hold_experts(moe, 1).sorts_by_expert
    # on a whole job the sort sits in the alltoall plan and not in the DeepEP one
    base: dict[str, Any] = {"model": _small_moe(), "gpu": "h100-sxm", "batch_size": 8,
                            "precision": "bf16", "num_gpus": 8, "ep": 4}
    steps = {d: estimate(**base, ep_dispatcher=d).step for d in ("alltoall", "deepep")}
    assert steps["alltoall"].breakdown_s["forward"] > steps["deepep"].breakdown_s["forward"]


def test_a_plain_all_to_all_exchanges_counts_first_and_megatron_sends_weights_too() -> None:
    """Before a plain all-to-all each rank learns every rank's tokens per expert (Megatron's
    gather over the group, torchtitan's all-to-all of counts); Megatron-LM's dispatcher also
    sends the routing weights in an all-to-all of their own, both ways. DeepEP's kernels
    carry both."""
    moe = MoE("m", 2048, 768, 128, 8, rows=4096, local_experts=8)
    tokens = 4096 * 8 * 2048 * 2
    assert ep_collectives(moe, "forward", 1, 2) == [
        ("all_gather", 16 * 128 * 8), ("all_to_all", tokens), ("all_to_all", tokens)]
    assert ep_collectives(moe, "backward", 1, 2) == [("all_to_all", tokens)] * 2
    weights = replace(moe, dispatches_probs=True)
    assert ep_collectives(weights, "forward", 1, 2)[2] == ("all_to_all", 4096 * 8 * 4)
    assert len(ep_collectives(weights, "backward", 1, 2)) == 3
    assert [c for c, _ in ep_collectives(weights, "forward", 1, 2, dedup_units=2)] == \
        ["all_to_all"] * 2
    assert load_stack("megatron").moe_dispatch_probs
    assert not load_stack("torchtitan").moe_dispatch_probs


def test_the_busiest_expert_parallel_rank_sets_the_pace() -> None:
    """--moe-imbalance F: the busiest EP rank's experts compute F x the mean token copies
    and its all-to-alls carry as many; the copies a rank routes out (permute, unpermute)
    stay its own. F runs from 1 (balanced) to the EP size."""
    from gpusim.plan.expert_parallel import hold_experts
    moe = MoE("m", 2048, 768, 128, 8, rows=4096)
    even, busy = hold_experts(moe, 16), hold_experts(moe, 16, imbalance=1.25)

    def named(layer: MoE, suffix: str) -> Any:
        return next(o for o in layer.forward(1, BF16) if o.name.endswith(suffix))

    assert named(busy, "experts_up").flops == pytest.approx(1.25 * named(even, "experts_up").flops)
    assert named(busy, "permute").bytes == named(even, "permute").bytes
    assert ep_collectives(busy, "backward", 1, 2)[0][1] == \
        pytest.approx(1.25 * ep_collectives(even, "backward", 1, 2)[0][1])
    assert busy.saved_bytes(1, BF16) > even.saved_bytes(1, BF16)
    # an uneven token count per expert keeps the products' stored rows aligned
    wgrad = next(o for o in busy.backward_weight(1, BF16) if o.name.endswith("up_wgrad"))
    assert wgrad.gemm is not None and wgrad.gemm.aligned(2)
    base: dict[str, Any] = {"model": _small_moe(), "gpu": "h100-sxm", "batch_size": 8,
                            "precision": "bf16", "num_gpus": 8, "ep": 8}
    balanced, loaded = estimate(**base), estimate(**base, moe_imbalance=1.5)
    # (this small model's step waits on its host; its device passes grow)
    assert loaded.step.breakdown_s["forward"] > balanced.step.breakdown_s["forward"]
    assert any("--moe-imbalance 1" in a for a in balanced.assumptions)
    assert any("1.5x the mean" in a for a in loaded.assumptions)
    with pytest.raises(InvalidConfig, match="moe-imbalance"):
        estimate(**base, moe_imbalance=0.9)
    with pytest.raises(InvalidConfig, match="EP size 8"):
        estimate(**base, moe_imbalance=9)


def test_expert_capacity_drops_or_pads_the_token_copies() -> None:
    """--capacity-factor C: an expert takes at most C x the mean copies and drops the rest,
    which caps the busiest rank's load; with --pad-to-capacity every expert computes exactly
    C x the mean (Megatron-LM's --moe-expert-capacity-factor and
    --moe-pad-expert-input-to-capacity), also without expert parallelism."""
    from gpusim.plan.expert_parallel import hold_experts
    moe = MoE("m", 2048, 768, 128, 8, rows=4096)
    assert hold_experts(moe, 16, imbalance=1.5, capacity=1.25).load == 1.25
    assert hold_experts(moe, 16, imbalance=1.1, capacity=1.25).load == 1.1
    assert hold_experts(moe, 16, imbalance=1.1, capacity=1.25, pad=True).load == 1.25
    assert hold_experts(moe, 1, capacity=1.5, pad=True).load == 1.5
    assert hold_experts(moe, 1, capacity=0.8).load == 0.8  # below the mean: copies dropped
    assert hold_experts(moe, 1, capacity=2.0) is moe  # dropless in effect
    base: dict[str, Any] = {"model": _small_moe(), "gpu": "h100-sxm", "batch_size": 8,
                            "precision": "bf16", "num_gpus": 8, "ep": 8}
    padded = estimate(**base, moe_capacity=2.0, moe_pad=True)
    assert padded.step.breakdown_s["forward"] > estimate(**base).step.breakdown_s["forward"]
    assert any("padded" in a for a in padded.assumptions)
    with pytest.raises(InvalidConfig, match="needs --capacity-factor"):
        estimate(**base, moe_pad=True)
    with pytest.raises(InvalidConfig, match="positive factor"):
        estimate(**base, moe_capacity=-1.0)


def test_every_nth_block_can_hold_the_experts() -> None:
    """--moe-every N (Megatron-LM's --moe-layer-freq N, Qwen2-MoE's decoder_sparse_step):
    block i is sparse when (i + 1) % N == 0, the others keep a dense MLP of ffn_hidden."""
    from gpusim.workload.hf_config import transformer_from_hf
    cfg = TransformerConfig(layers=4, hidden=256, heads=4, ffn_hidden=1024, vocab=1000,
                            seq_len=64, norm="rmsnorm", activation="swiglu",
                            positions="rotary", experts=8, top_k=2, moe_ffn=128,
                            moe_every=2)
    model = build_transformer(cfg)
    sparse = [la.block for la in model.layers if isinstance(la, MoE)]
    assert sparse == ["h.1", "h.3"]
    assert sum(la.name.endswith("mlp.up") for la in model.layers) == 2
    qwen2_moe = transformer_from_hf({
        "model_type": "qwen2_moe", "hidden_size": 256, "intermediate_size": 1024,
        "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 1000,
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
        "decoder_sparse_step": 2}, "qwen2_moe")
    assert qwen2_moe.moe_every == 2
    with pytest.raises(GpusimError, match="mlp_only_layers"):
        transformer_from_hf({"model_type": "qwen2_moe", "hidden_size": 256,
                             "intermediate_size": 1024, "num_hidden_layers": 4,
                             "num_attention_heads": 4, "vocab_size": 1000, "num_experts": 8,
                             "num_experts_per_tok": 2, "moe_intermediate_size": 128,
                             "mlp_only_layers": [0]}, "qwen2_moe")
