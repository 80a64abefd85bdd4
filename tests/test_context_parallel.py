"""Context parallelism: each sequence split over ranks that gather each other's keys."""

from __future__ import annotations

import pytest

from gpusim.cli import main
from gpusim.errors import InvalidConfig
from gpusim.estimation import build_job, estimate
from gpusim.plan.context_parallel import cp_collectives, split_sequence
from gpusim.plan.parallel import plan_parallel
from gpusim.plan.parallel_job import ParallelJob
from gpusim.plan.stage_memory import stage_memory
from gpusim.workload.attention import Attention
from gpusim.workload.model import Model
from gpusim.workload.numerics import Numerics
from gpusim.workload.zoo.transformer import TransformerConfig, build_transformer

SEQ = 16384
BF16 = Numerics("bf16", "bf16", "bf16")


def _model(seq: int = SEQ) -> Model:
    return build_transformer(TransformerConfig(
        name="llama-small", layers=4, hidden=2048, heads=16, kv_heads=4, ffn_hidden=5632,
        vocab=32000, seq_len=seq, norm="rmsnorm", activation="swiglu", positions="rotary",
        bias=False))


def _job(cp: int, gpus: int = 8, **kw: object) -> ParallelJob:
    job, _ = build_job(_model(), "h100-sxm", 8, precision="bf16", num_gpus=gpus, cp=cp,
                       zero=3, **kw)  # type: ignore[arg-type]
    assert isinstance(job, ParallelJob)
    return job


def test_a_rank_attends_its_queries_over_every_key() -> None:
    att = next(la for la in _model().layers if isinstance(la, Attention))
    part = split_sequence(att, 4)
    assert isinstance(part, Attention)
    assert (part.seq, part.keys) == (SEQ // 4, SEQ)
    # the four ranks' attention adds up to the whole sequence's, under the causal mask too
    whole = sum(op.flops for op in att.forward(1, BF16) if op.kind == "attention")
    share = sum(op.flops for op in part.forward(1, BF16) if op.kind == "attention")
    assert 4 * share == pytest.approx(whole)
    # forward gathers K and V; backward gathers them again and reduce-scatters their grads
    assert [c for c, _ in cp_collectives(part, "forward", 1, 2)] == ["all_gather"]
    assert [c for c, _ in cp_collectives(part, "backward", 1, 2)] == ["all_gather",
                                                                      "reduce_scatter"]
    size = cp_collectives(part, "forward", 1, 2)[0][1]
    assert size == 2 * SEQ * 4 * (2048 // 16) * 2  # K and V of every token, 4 KV heads


def test_ring_steps_merge_outputs_and_accumulate_gradients_in_fp32() -> None:
    """PyTorch's ring attention runs the kernel once per step and merges the blocks'
    outputs in fp32 (torch/distributed/tensor/experimental/_attention.py): bytes beyond the
    kernels, and none without context parallelism."""
    att = next(la for la in _model().layers if isinstance(la, Attention))
    part = split_sequence(att, 4)
    assert isinstance(part, Attention) and part.cp_steps == 4
    q = SEQ // 4 * 16 * 128  # this rank's output: a quarter of the tokens, 16 heads of 128
    kv = 2 * SEQ // 4 * 4 * 128  # its K and V, 4 KV heads
    merge = next(op for op in part.forward(1, BF16) if op.name.endswith("ring_merge"))
    # each of 4 blocks converted to fp32 (2 bytes read, 4 written), 3 merges (5 fp32 reads,
    # 3 writes), the result cast back (4 read, 2 written)
    assert merge.bytes == 4 * q * 6 + 3 * q * 32 + q * 6
    pack = next(op for op in part.forward(1, BF16) if op.name.endswith("ring_kv_pack"))
    assert pack.bytes == 3 * kv * 2 * 2  # K and V packed to pass on, all steps but the last
    accumulate = [op for op in part.backward_input(1, BF16) if "ring_grad" in op.name]
    assert len(accumulate) == 1 and accumulate[0].bytes > 4 * (q + kv) * 4
    assert not any("ring" in op.name for op in att.forward(1, BF16) + att.backward_input(1, BF16))


def test_context_parallel_ranks_hold_a_slice_of_the_activations() -> None:
    plain, split = _job(1), _job(4)
    assert split.parallel.describe().startswith("TP 1 x CP 4 x PP 1 x DP 2")
    assert split.microbatches == plain.microbatches == 1
    kept = [stage_memory(plan_parallel(j), plan_parallel(j).stages[0]).activations
            for j in (plain, split)]
    # the same samples per replica (1 each), each rank a quarter of its tokens
    assert kept[1] * 4 == pytest.approx(kept[0] * 8 / 2, rel=0.05)


def test_context_parallel_step_pays_its_gathers_and_reports_whole_samples() -> None:
    result = estimate(_model(), "h100-sxm", 8, precision="bf16", num_gpus=8, cp=4, zero=3)
    step = result.step
    assert step.samples_per_step == 8 and step.tokens_per_sample == SEQ
    assert step.breakdown_s["context_parallel_comm"] > 0
    assert sum(step.breakdown_s.values()) == pytest.approx(step.step_time_s, rel=1e-6)
    plain = estimate(_model(), "h100-sxm", 8, precision="bf16", num_gpus=8, zero=3).step
    assert plain.breakdown_s["context_parallel_comm"] == 0
    # as many FLOPs per step either way; splitting the sequence only adds the gathers
    assert step.model_flops_per_step == pytest.approx(plain.model_flops_per_step)
    assert step.step_time_s > plain.step_time_s


@pytest.mark.parametrize(("kw", "message"), [
    ({"cp": 3}, "do not split"),
    ({"cp": 4, "attention": "math"}, "fused"),
    ({"cp": 2, "shard_group": 2}, "shard-group"),
])
def test_context_parallelism_refuses_what_it_cannot_split(kw: dict, message: str) -> None:
    with pytest.raises(InvalidConfig, match=message):
        _job(gpus=8, **kw)


def test_a_sequence_must_split_into_two_chunks_per_rank() -> None:
    with pytest.raises(InvalidConfig, match="multiple of 8"):
        build_job(_model(seq=1020), "h100-sxm", 8, precision="bf16", num_gpus=8, cp=4)
    with pytest.raises(InvalidConfig, match="splits a sequence"):
        build_job("resnet50", "h100-sxm", 8, precision="bf16", num_gpus=8, cp=2)


def test_cli_takes_cp(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--num-gpus", "8",
                 "--cp", "4", "--seq-len", "32768", "--batch-size", "2", "--precision",
                 "bf16", "--zero", "3", "--checkpointing", "full"])
    out = capsys.readouterr().out
    assert code == 0 and "CP 4" in out and "context parallel comm" in out


def test_search_tries_context_parallelism_for_long_sequences() -> None:
    from gpusim.comm.topology import Topology
    from gpusim.explore.search import candidates, search

    topo = Topology.build("dgx-h100", 8)
    configs = list(candidates(_model(), topo, 8))  # 16K tokens a sequence
    assert {c.context for c, _ in configs} == {1, 2, 4, 8}
    assert {c.context for c, _ in candidates(_model(seq=4096), topo, 8)} == {1}
    found = search(_model(), topo, 8, top=2)
    assert found.ranked and all(r.config.num_gpus == 8 for r in found.ranked)
    assert any(r.config.context > 1 for r in found.ranked) or any(
        "CP" in label for label, _ in found.rejected)
