"""NCCL's communicators hold device memory outside PyTorch's caching allocator: a job on more
than one GPU needs it beside its allocated peak (issue 14: "communication buffers")."""

from __future__ import annotations

import re

import pytest
import yaml

from gpusim.comm import nccl_memory
from gpusim.data import data_dir
from gpusim.estimation import build_job
from gpusim.plan.memory import memory_plan
from gpusim.plan.memory_report import memory_report, peak_plan
from gpusim.plan.parallel import plan_parallel

ROWS = data_dir("measurements") / "published" / "nccl_memory.yaml"
MIB = 2**20


def _published() -> dict[str, object]:
    data = yaml.safe_load(ROWS.read_text())
    rows = {row["id"]: row for row in data["measurements"]}
    constants = {item["name"]: item for item in data["constants"]["items"]}
    return {"rows": rows, "constants": constants}


def test_the_figures_are_the_published_rows() -> None:
    pub = _published()
    rows, constants = pub["rows"], pub["constants"]
    assert isinstance(rows, dict) and isinstance(constants, dict)
    assert rows["nccl-964-a100-nvlink-pg2"]["value"] * 1e6 == nccl_memory.PAIR_COMMUNICATOR_BYTES
    assert rows["nccl-964-a100-nvlink-pg3plus"]["value"] * 1e6 == nccl_memory.COMMUNICATOR_BYTES
    before, after = map(float, re.findall(r"[\d.]+", rows["nccl-1685-h100-alltoall"]["value"]))
    assert "8x H100" in rows["nccl-1685-h100-alltoall"]["hardware"]
    assert pytest.approx((after - before) * 1e9 / 7) == nccl_memory.PEER_BYTES
    skipped = rows["nccl-pr2366-rtx3090-single-rank"]
    before, after = map(float, re.findall(r"\d+", skipped["value"]))
    assert (before - after) * MIB == nccl_memory.NET_SHARED_BYTES
    assert "536870912 bytes" in " ".join(skipped["caveats"])
    channels = constants["NVLS channels default"]["text"]
    assert f"SM90 {nccl_memory.NVLS_CHANNELS['hopper']}" in channels
    assert f"SM100 {nccl_memory.NVLS_CHANNELS['blackwell']}" in channels
    assert "128 * 1024" in constants["NVLS enable / chunk size params"]["text"]
    assert nccl_memory.NVLS_CHUNK_BYTES == 128 * 1024
    assert constants["NCCL_STEPS"]["value"] == nccl_memory.NCCL_STEPS


def test_one_gpu_holds_no_communicator() -> None:
    job, _ = build_job("gpt2", "h100-sxm", 8, precision="bf16")
    plan = memory_plan(job)
    assert plan.nccl_communicators == 0.0
    assert "nccl_communicators" in plan.breakdown()


def test_fsdp_on_eight_h100s_holds_one_communicator_with_nvlink_sharp() -> None:
    job, _ = build_job("llama3-8b", "h100-sxm", 8, precision="bf16", num_gpus=8, zero=3,
                       seq_len=2048)
    plan = peak_plan(job)
    # 688 MB of collective buffers, and NVLS: 16 channels x 2 x 1 MiB x 8 ranks = 256 MiB
    assert plan.nccl_communicators == pytest.approx(688e6 + 256 * MIB)
    assert plan.required_bytes == pytest.approx(
        plan.peak_bytes + plan.stranded_bytes + plan.framework_reserved
        + plan.nccl_communicators)
    assert sum(plan.breakdown().values()) == pytest.approx(plan.required_bytes)
    assert "nccl communicators" in memory_report(job).summary()


def test_an_nvswitch_without_sharp_holds_the_collective_buffers_only() -> None:
    job, _ = build_job("llama3-8b", "a100-80gb", 8, precision="bf16", num_gpus=8, zero=3,
                       seq_len=2048)
    assert peak_plan(job).nccl_communicators == pytest.approx(688e6)


def test_each_process_group_is_a_communicator_and_neighbours_add_peer_buffers() -> None:
    job, _ = build_job("llama3-8b", "h100-sxm", 16, precision="bf16", num_gpus=16, tp=2, pp=2,
                       seq_len=2048)
    # TP 2 (a pair), DP 4 (four ranks of a node: NVLS for 4), one pipeline neighbour in
    # the other node: the buffer sends over the network share
    expected = 544e6 + (688e6 + 16 * 2 * MIB * 4) + nccl_memory.NET_SHARED_BYTES
    assert peak_plan(job).nccl_communicators == pytest.approx(expected)


def test_peers_in_other_nodes_share_one_buffer() -> None:
    job, _ = build_job("llama3-8b", "h100-sxm", 16, precision="bf16", num_gpus=16, pp=16,
                       seq_len=2048)
    groups = plan_parallel(job).groups
    # the stage at a node's edge: one neighbour in its node, one beyond it
    assert nccl_memory.communicator_bytes(groups, "hopper")["pipeline"] == pytest.approx(
        nccl_memory.PEER_BYTES + nccl_memory.NET_SHARED_BYTES)
    # experts over two nodes: seven peers in the node, and one shared buffer for the rest
    job, _ = build_job("llama3-8b", "h100-sxm", 16, precision="bf16", num_gpus=16,
                       seq_len=2048)
    expert = plan_parallel(job).groups["shard"]  # 16 ranks over two nodes
    assert nccl_memory.communicator_bytes({"expert": expert}, "hopper")["expert"] == (
        pytest.approx(nccl_memory.collective_bytes(expert, "hopper")
                      + 7 * nccl_memory.PEER_BYTES + nccl_memory.NET_SHARED_BYTES))


def test_expert_parallelism_adds_a_peer_buffer_for_every_other_rank() -> None:
    from tests.test_moe import _small_moe

    def held(ep: int) -> float:
        job, _ = build_job(_small_moe(), "h100-sxm", 8, precision="bf16", num_gpus=8, ep=ep)
        return peak_plan(job).nccl_communicators

    # EP 4 inside DP 8: its group of four gains a communicator and three peers' buffers
    assert held(4) - held(1) == pytest.approx(688e6 + 16 * 2 * MIB * 4
                                              + 3 * nccl_memory.PEER_BYTES)
