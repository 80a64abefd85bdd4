"""Predictions that speed-ups of planning and search must leave as they are (issue 21).

The numbers below were recorded from the code before the search was made faster: parallel
estimates across TP/PP/DP, microbatch, recompute, ZeRO, interleaving, sequence, context and
expert parallelism, LoRA, frozen layers, fp8 and torch.compile, on A100s and H100s, and two
searches, their ranking included. A change that moves any of them fails here; one that
moves them on purpose records the new numbers (running this file prints them) and says
why. Below them, chunks that plan_parallel puts together from their blocks' costs are
checked against the same chunks costed whole, to the last bit.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import pytest

from gpusim import estimate
from gpusim.comm.topology import Topology
from gpusim.explore.search import search
from gpusim.workload import zoo

REL = 1e-9


def _case(**options: Any) -> dict[str, Any]:
    return options


# name: estimate() arguments
ESTIMATES: dict[str, dict[str, Any]] = {
    "gpt3-175b-tp8-pp16-dp8": _case(
        model="gpt3-175b", batch_size=1536, system="dgx-a100", num_gpus=1024, tp=8, pp=16,
        dp=8, microbatch_size=1, schedule="1f1b", checkpointing="selective"),
    "gpt3-13b-interleaved-full-zero1-sp": _case(
        model="gpt3-13b", batch_size=256, system="dgx-a100", num_gpus=64, tp=4, pp=4,
        microbatch_size=2, schedule="interleaved", virtual_stages=2, checkpointing="full",
        zero=1, sequence_parallel=True),
    "llama3-8b-fsdp-per-op": _case(
        model="llama3-8b", batch_size=64, system="dgx-h100", num_gpus=16, tp=2,
        microbatch_size=1, zero=3, checkpointing="per-op"),
    "gpt3-1.3b-ddp-autocast": _case(
        model="gpt3-1.3b", batch_size=64, system="dgx-a100", num_gpus=16, microbatch_size=4,
        checkpointing="full"),
    "llama3-8b-per-op-pp-zero1-local-ddp": _case(
        model="llama3-8b", batch_size=64, system="dgx-h100", num_gpus=16, tp=2, pp=2,
        microbatch_size=2, zero=1, overlap_grad_reduce=False, checkpointing="per-op"),
    "llama3-70b-tp-overlap": _case(
        model="llama3-70b", batch_size=128, system="dgx-h100", num_gpus=64, tp=8, pp=4,
        microbatch_size=1, sequence_parallel=True, tp_overlap=True,
        checkpointing="selective"),
    "gpt3-2.7b-gpipe-fp16": _case(
        model="gpt3-2.7b", batch_size=128, system="dgx-a100", num_gpus=16, pp=4,
        microbatch_size=4, schedule="gpipe", precision="fp16"),
    "llama-2-13b-uneven-stages": _case(
        model="llama-2-13b", batch_size=64, system="dgx-a100", num_gpus=32, tp=2, pp=4,
        pp_layers=(9, 11, 11, 9), microbatch_size=1, zero=1, checkpointing="full"),
    "mixtral-8x7b-ep": _case(
        model="mixtral-8x7b", batch_size=64, system="dgx-h100", num_gpus=32, tp=2, pp=2,
        ep=8, microbatch_size=1, sequence_parallel=True, checkpointing="full"),
    "llama3-8b-lora": _case(
        model="llama3-8b", batch_size=32, system="dgx-a100", num_gpus=8, tp=2,
        microbatch_size=1, finetune="lora"),
    "llama3-8b-cp-32k": _case(
        model="llama3-8b", batch_size=16, system="dgx-h100", num_gpus=16, tp=4, cp=2,
        seq_len=32768, microbatch_size=1, sequence_parallel=True, checkpointing="full"),
    "llama3-8b-compiled-torchtitan": _case(
        model="llama3-8b", batch_size=64, system="dgx-h100", num_gpus=16, tp=2,
        microbatch_size=2, zero=3, stack="torchtitan", compile=True,
        checkpointing="per-op"),
    "llama3-8b-fp8-interleaved": _case(
        model="llama3-8b", batch_size=64, system="dgx-h100", num_gpus=16, tp=4, pp=2,
        microbatch_size=1, schedule="interleaved", virtual_stages=2, precision="fp8",
        checkpointing="selective"),
    "gpt3-1.3b-frozen": _case(
        model="gpt3-1.3b", batch_size=64, system="dgx-a100", num_gpus=8, tp=2, pp=2,
        microbatch_size=2, frozen=("embed", "h.0.", "h.1.")),
}

# name: (model, system, GPUs, global batch, search() options)
SEARCHES: dict[str, tuple[str, str, int, int, dict[str, Any]]] = {
    "gpt2-medium-h100x16": ("gpt2-medium", "dgx-h100", 16, 64, {"top": 3}),
    "llama3-8b-a100x32": ("llama3-8b", "dgx-a100", 32, 128, {"top": 2}),
}


def _estimate(name: str) -> tuple[float, float, float]:
    """(step seconds, peak bytes per GPU, active fraction) of one case."""
    step = estimate(gpu=None, **{"precision": "bf16", **ESTIMATES[name]}).step
    return step.step_time_s, step.peak_memory_bytes, step.active_fraction


def _digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def _summary(name: str) -> dict[str, Any]:
    """What a search found: its counts, its best ten rows in full, the order of every row
    (a digest of their labels), weighted sums of every row's step time and peak, and the
    rejections (a digest of their labels and reasons)."""
    model, system, gpus, batch, options = SEARCHES[name]
    found = search(zoo.get(model), Topology.build(system, gpus), batch, **options)
    labels = [f"{r.config.describe()}, recompute {r.checkpointing}" for r in found.ranked]
    return {
        "counts": (found.considered, len(found.ranked), len(found.rejected), found.dominated),
        "best": [(label, r.step_time_s, r.simulated, r.peak_memory_bytes, r.mfu)
                 for label, r in zip(labels[:10], found.ranked, strict=False)],
        "order": _digest(labels),
        "step_sums": (math.fsum(r.step_time_s for r in found.ranked),
                      math.fsum(i * r.step_time_s for i, r in enumerate(found.ranked))),
        "peak_sums": (math.fsum(r.peak_memory_bytes for r in found.ranked),
                      math.fsum(i * r.peak_memory_bytes for i, r in enumerate(found.ranked))),
        "rejected": _digest([f"{label}: {why}" for label, why in found.rejected]),
    }


# re-recorded (2026-11-23): gradient buckets wait on their own layers' gradients
# (ChunkPlan.grad_ready) and FSDP reduce-scatters a block at a time, instead of 25 MiB
# buckets ready evenly through backward; steps move by 0.6% at most, and the A100 search's
# best two swap (ZeRO-3 first: 8.28 against 8.33 s, one reduce-scatter per block); peaks
# re-recorded the same day: a checkpointed block's input is what its first layer reads (the
# sequence shard under sequence parallelism; on a later pipeline stage, the activation it
# received, counted as none before)
# re-recorded (2026-11-24): the hopper fit gained long_k_slope (a product's rate falls with
# its inner dimension at the power limit) and with it a higher max_efficiency for short K:
# H100 bf16 steps move by 1.6% at most (llama3-8b-compiled-torchtitan, llama3-8b-per-op-pp),
# fp8 -0.3%, A100 ones not at all; the H100 search keeps its best ten, its order changes
# re-recorded (2026-11-24): the hopper fit takes small products' device figures from CUDA-graph
# replays and their loop-timed runs for the host's cost alone (ramp 6.3 -> 2.3 us, bf16
# max_efficiency 0.806 -> 0.782, an fp8 product's own host cost): H100 bf16 steps +1.2 to
# +1.6%, fp8 -1.0%, A100 ones (hopper's host figures) by parts in a million
# re-recorded (2026-11-24): the hopper fit gained the exposed share of a product's result
# write (epilogue_exposed 0.66; fp8 products read 1-byte operands into a bf16 result) and
# with it a higher bf16 max_efficiency (0.782 -> 0.818): H100 steps move by -0.3% to
# +0.5% (fp8 interleaved +0.5%, TP-overlap 70B -0.3%), A100
# ones (hopper's host figures) by parts in a million; the H100 search keeps its best ten
# (its full order changes), the A100 search its order
# re-recorded (2026-11-24): a step's tensor-core products run at the rate they sustain for
# seconds at the power limit (hopper sustained_factor 0.95, from the H100's sustained GEMM):
# the H100 bf16 and fp8 estimates 2.6-3.8% slower; the A100 ones unchanged
# re-recorded (2026-11-25): rotary embeddings costed (see EXPECTED_SEARCHES)
EXPECTED_ESTIMATES: dict[str, tuple[float, float, float]] = {
    "gpt3-175b-tp8-pp16-dp8": (20.627251747566717, 52997675008.0, 0.7596752083552246),
    "gpt3-13b-interleaved-full-zero1-sp": (4.836035001246042, 8602763776.0, 0.7964918275709902),
    "llama3-8b-fsdp-per-op": (4.227231213303846, 25819513856.0, 0.8670392209502791),
    "gpt3-1.3b-ddp-autocast": (0.5616941274933052, 31585746944.0, 0.9702211864641818),
    "llama3-8b-per-op-pp-zero1-local-ddp": (4.74182824678022, 40685666304.0, 0.7796159160191187),
    "llama3-70b-tp-overlap": (15.236693823829405, 68388519936.0, 0.843802798709003),
    "gpt3-2.7b-gpipe-fp16": (2.084069030634744, 73331204096.0, 0.6452716612576915),
    "llama-2-13b-uneven-stages": (5.616997546486566, 17820579840.0, 0.741674069110003),
    # re-recorded (2026-11-25): a plain all-to-all exchanges the tokens per expert first
    "mixtral-8x7b-ep": (5.030436528249124, 35656900608.0, 0.6178377802850019),
    "llama3-8b-lora": (6.693116268928794, 32729210880.0, 0.9451707765927239),
    # re-recorded (2026-11-23): ring attention's fp32 merges and gradient sums costed
    "llama3-8b-cp-32k": (7.157087167249799, 42272497664.0, 0.8799845205538926),
    # peak re-recorded (2026-11-23): a compiled loss keeps the head's logits, counted once
    "llama3-8b-compiled-torchtitan": (3.862543248957773, 35362210816.0, 0.8905300509228337),
    "llama3-8b-fp8-interleaved": (4.024728264337911, 40182480896.0, 0.7548102930624564),
    "gpt3-1.3b-frozen": (0.966777708812401, 9347321856.0, 0.749988775929837),
}

# re-recorded (2026-11-24): FSDP2 copies each unit's gathered weights into its parameters
# (ZeRO-3 rows 0.5-1.8% slower); the A100 search keeps its best nine, the tenth changes.
# re-recorded (2026-11-24): a job fits against what the driver gives a process less what the
# allocator strands (2.2% of the peak), not 95% of the card: on 80 GB A100s a ZeRO-1 plan
# at 76.2 GiB now fits and leads (tied with ZeRO-2); the rest keep their order
# re-recorded (2026-11-24): a rank's NCCL communicators hold memory outside the allocator
# (gpusim.comm.nccl_memory), and a job is refused only if it would not fit fragmenting as
# little as the lower quartile of published OOM messages: on the A100s one more plan is
# refused; the best ten and every estimate above are unchanged
# re-recorded (2026-11-24): the hopper fit pools a fifth H100 micro run (micro-run6.json:
# layout factors, compiled and upcast norms, more host cases), and the many-GPU planner lets
# torch.optim's Python run while the device finishes the backward the host queued ahead
# (as the one-GPU engine does): DDP and ZeRO steps with torch.optim 1-7% faster (GPT-2
# medium on 16 H100s 67.2 -> 62.3 ms), compiled torchtitan Llama 3 8B +5.2%, the rest
# within 1%; the H100 search keeps its best ten, reordered; and again the same day when a
# step's products came to run at their sustained rate: its best ten kept, their order moved
# re-recorded (2026-11-24): the hopper fit gained fp32 attention's own factors, which moved
# its host figure for an attention layer's backward (313.7 -> 327.3 us): the H100 search's
# best ten keep their ranks, each 0.33 ms (0.5%) slower; the A100 search is unchanged
# re-recorded (2026-11-24): FSDP (ZeRO-3 without Megatron-LM's master weights) pays its
# gradients' reduce-scatter copy-in (FSDP2) or concatenation, cast and pre-divide (FSDP1)
# before each unit's reduce-scatter: the TP 1 ZeRO-3 rows of both searches are 0.3% (H100)
# and 1.3% (A100) slower and drop one and five places; the rest are unchanged
# re-recorded (2026-11-25): rotary embeddings are costed (the stack's rope choice; the
# default pytorch stack's rotate_half is 5 kernels forward and 9 backward on each of q and
# k): Llama estimates 0.4-4% slower (GPT ones unchanged); the A100 Llama search 2% slower,
# one ZeRO-3 plan up two places; the GPT-2 search unchanged
EXPECTED_SEARCHES: dict[str, dict[str, Any]] = {
    "gpt2-medium-h100x16": {
        "counts": (2240, 560, 0, 1680),
        "best": [
            ("TP 2 x PP 1 x DP 8, microbatch 8, ZeRO-3, sequence parallel, recompute none",
             0.06278868045856194, True, 5926444800.0, 0.15168963072060374),
            ("TP 1 x PP 1 x DP 16, microbatch 4, ZeRO-3, recompute none",
             0.06286126467626699, True, 6769735936.0, 0.1515144787691353),
            ("TP 2 x PP 1 x DP 8, microbatch 8, ZeRO-1, sequence parallel, recompute none",
             0.06298624685633972, False, 6700319232.0, 0.15121383202775474),
            ("TP 2 x PP 1 x DP 8, microbatch 8, ZeRO-2, sequence parallel, recompute none",
             0.06298624685633972, False, 6077280256.0, 0.15121383202775474),
            ("TP 2 x PP 1 x DP 8, microbatch 8, sequence parallel, recompute none",
             0.06327535227992405, False, 8569436160.0, 0.15052293521904483),
            ("TP 2 x PP 1 x DP 8, microbatch 8, ZeRO-3, recompute none",
             0.06368696490300646, True, 6954049280.0, 0.14955009658096663),
            ("TP 2 x PP 1 x DP 8, microbatch 8, ZeRO-1, recompute none",
             0.06388453130078424, False, 7727923712.0, 0.1490876047497327),
            ("TP 2 x PP 1 x DP 8, microbatch 8, ZeRO-2, recompute none",
             0.06388453130078424, False, 7104884736.0, 0.1490876047497327),
            ("TP 2 x PP 1 x DP 8, microbatch 8, recompute none",
             0.06417363672436857, False, 9597040640.0, 0.1484159576790287),
            ("TP 1 x PP 1 x DP 16, microbatch 4, ZeRO-1, recompute none",
             0.06642146376666738, False, 10220008960.0, 0.14339328301543577),
        ],
        "order": "df2264841e70ece4",
        "step_sums": (212.78423711571824, 86334.48176632659),
        "peak_sums": (2040675265280.0, 406262440476416.0),
        "rejected": "e3b0c44298fc1c14",
    },
    "llama3-8b-a100x32": {
        "counts": (2948, 656, 1113, 1179),
        "best": [
            ("TP 2 x PP 1 x DP 16, microbatch 2, ZeRO-1, sequence parallel, recompute none",
             8.34732458856782, False, 81855605760.0, 0.6613425131429762),
            ("TP 2 x PP 1 x DP 16, microbatch 2, ZeRO-2, sequence parallel, recompute none",
             8.34732458856782, False, 66798366720.0, 0.6613425131429762),
            ("TP 2 x PP 1 x DP 16, microbatch 1, ZeRO-3, sequence parallel, recompute none",
             8.440724390182716, False, 33473688064.0, 0.6540245085889012),
            ("TP 2 x PP 1 x DP 16, microbatch 2, ZeRO-3, recompute none",
             8.498391299481783, False, 69569933824.0, 0.6495865425448496),
            ("TP 2 x PP 1 x DP 16, microbatch 2, ZeRO-3, sequence parallel, recompute none",
             8.511897197432107, True, 60845781504.0, 0.6485558381848202),
            ("TP 2 x PP 1 x DP 16, microbatch 1, ZeRO-1, sequence parallel, recompute none",
             8.518903376849382, False, 54483512320.0, 0.6480224481035579),
            ("TP 2 x PP 1 x DP 16, microbatch 1, ZeRO-2, sequence parallel, recompute none",
             8.518903376849382, False, 39426273280.0, 0.6480224481035579),
            ("TP 2 x PP 1 x DP 16, microbatch 2, ZeRO-2, recompute none",
             8.57657028614845, False, 75522519040.0, 0.6436652924467213),
            ("TP 1 x PP 1 x DP 32, microbatch 1, ZeRO-3, recompute none",
             8.589194362863095, True, 66122377216.0, 0.6427192572672713),
            ("TP 2 x PP 1 x DP 16, microbatch 1, ZeRO-3, recompute none",
             8.66854448776336, False, 37835764224.0, 0.6368359335545125),
        ],
        "order": "0dfc14cbbaa17405",
        "step_sums": (8890.189114520466, 3385870.942762997),
        "peak_sums": (35143152930816.0, 1.1813631129225216e+16),
        "rejected": "a3dd23008fdb35d0",
    },
}


@pytest.mark.parametrize("name", list(ESTIMATES))
def test_parallel_estimates_are_unchanged(name: str) -> None:
    assert _estimate(name) == pytest.approx(EXPECTED_ESTIMATES[name], rel=REL)


@pytest.mark.parametrize("name", list(SEARCHES))
def test_search_results_and_ranking_are_unchanged(name: str) -> None:
    got, want = _summary(name), EXPECTED_SEARCHES[name]
    assert got["counts"] == want["counts"]
    assert [row[0] for row in got["best"]] == [row[0] for row in want["best"]]
    for row, expected in zip(got["best"], want["best"], strict=True):
        assert row[1:] == pytest.approx(expected[1:], rel=REL), row[0]
    assert got["order"] == want["order"]
    assert got["step_sums"] == pytest.approx(want["step_sums"], rel=REL)
    assert got["peak_sums"] == pytest.approx(want["peak_sums"], rel=REL)
    assert got["rejected"] == want["rejected"]


# (model, system, GPUs, batch, split, precision, recompute, job options): chunks of several
# identical blocks, which plan_parallel assembles from a costed template of three.
ASSEMBLED = [
    ("gpt3-1.3b", "dgx-a100", 8, 16, {"tensor": 2, "pipeline": 2, "data": 2,
                                      "schedule": "interleaved", "virtual_stages": 2},
     "bf16", "full", {}),
    ("gpt3-1.3b", "dgx-a100", 4, 16, {"tensor": 2, "pipeline": 2, "sequence_parallel": True,
                                      "microbatch_size": 2}, "bf16", "per-op", {}),
    ("gpt3-1.3b", "dgx-a100", 4, 16, {"pipeline": 2, "data": 2}, "fp16", "every-k:4", {}),
    ("gpt3-1.3b", "dgx-a100", 2, 16, {"data": 2, "microbatch_size": 2}, "bf16", "full", {}),
    ("llama3-8b", "dgx-h100", 4, 8, {"tensor": 2, "pipeline": 2, "sequence_parallel": True,
                                     "tp_overlap": True}, "fp8", "selective", {}),
    ("llama3-8b", "dgx-h100", 4, 8, {"tensor": 2, "data": 2, "zero": 3}, "bf16", "per-op",
     {"stack": "torchtitan"}),
    ("llama-2-13b", "dgx-a100", 8, 8, {"tensor": 2, "pipeline": 4, "stage_blocks": (9, 18, 2, 11)},
     "bf16", "none", {}),
    ("mixtral-8x7b", "dgx-h100", 8, 8, {"tensor": 2, "pipeline": 2, "data": 2, "expert": 2,
                                        "sequence_parallel": True}, "bf16", "full", {}),
]


@pytest.mark.parametrize("case", ASSEMBLED, ids=lambda c: f"{c[0]}-{c[6]}")
def test_chunks_assembled_from_blocks_equal_chunks_costed_whole(
        case: tuple[Any, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pass total, activation and parameter count of a chunk put together from its
    blocks' costs is the one its whole lowering gives, to the last bit; so is every
    stage's memory."""
    from gpusim.plan import parallel
    from gpusim.plan.parallel_job import ParallelConfig, ParallelJob
    from gpusim.plan.stage_memory import stage_memory
    from gpusim.stack import load_stack

    model, system, gpus, batch, split, precision, recompute, options = case
    if "stack" in options:
        options = {**options, "stack": load_stack(options["stack"])}
    job = ParallelJob(zoo.get(model), Topology.build(system, gpus), batch,
                      ParallelConfig(**split), precision, "adam", recompute, **options)
    assembled = parallel.plan_parallel(job)
    built = []
    original = parallel.chunk_template

    def counted(*args: Any, **kwargs: Any) -> Any:
        built.append(original(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(parallel, "chunk_template", counted)
    assert parallel.plan_parallel(job).stages == assembled.stages
    assert any(t is not None for t in built) or recompute.startswith("every-k")
    monkeypatch.setattr(parallel, "chunk_template", lambda *args, **kwargs: None)
    whole = parallel.plan_parallel(job)
    for a, w in zip(assembled.stages, whole.stages, strict=True):
        assert a.chunks == w.chunks
        assert a.optimizer_s == w.optimizer_s
        assert stage_memory(assembled, a) == stage_memory(whole, w)


if __name__ == "__main__":
    # After a change that moves predictions on purpose: print today's figures in the form
    # of EXPECTED_ESTIMATES and EXPECTED_SEARCHES above, to paste there (and say why they
    # moved in the commit).  python tests/test_search_speed_identity.py
    import pprint

    pprint.pprint({name: _estimate(name) for name in ESTIMATES}, width=100)
    pprint.pprint({name: _summary(name) for name in SEARCHES}, width=100)
