"""FSDP2 copies each all-gather into its unit's parameters; FSDP1 does not (issue 15).

torch.distributed.fsdp.fully_shard (FSDP2) keeps every parameter in its own storage, so a
unit's all-gather output is copied out into them (foreach_all_gather_copy_out,
split_with_sizes_copy) on the compute stream, once per gather: before the unit's forward
and again before its backward. FSDP1's FlatParameter makes the layers views into the
gathered buffer, and Megatron-style sharding (master weights) gathers no FSDP units.
"""

from __future__ import annotations

import pytest

from gpusim.comm.topology import Topology
from gpusim.cost.kernels import kernel_cost
from gpusim.hardware.calibration import calibration_for
from gpusim.plan.chunk import ChunkPlan
from gpusim.plan.parallel import plan_parallel
from gpusim.plan.parallel_job import ParallelConfig, ParallelJob
from gpusim.stack import load_stack
from gpusim.workload.ops import memory_op
from gpusim.workload.zoo.transformer import TransformerConfig, build_transformer

GPT = build_transformer(TransformerConfig(name="gpt-8l", layers=8, hidden=1024, heads=16,
                                          vocab=51200, seq_len=1024))
TOPOLOGY = Topology.build("dgx-a100", 8)


def _chunk(fsdp: str, zero: int = 3, master_weights: bool = False) -> ChunkPlan:
    stack = load_stack("pytorch").model_copy(update={"fsdp": fsdp})
    job = ParallelJob(GPT, TOPOLOGY, 16, ParallelConfig(data=8, microbatch_size=2, zero=zero),
                      "bf16", "adam", "none", megatron=master_weights, stack=stack)
    return plan_parallel(job).stages[0].chunks[0]


def test_fsdp2_copies_each_units_gather_out_before_its_forward_and_its_backward() -> None:
    per_parameter, flat = _chunk("per_parameter"), _chunk("flat")
    gpu = TOPOLOGY.gpu
    cal = calibration_for(gpu)
    units: dict[str, int] = {}
    for layer in GPT.layers:
        units[layer.block or layer.name] = units.get(layer.block or layer.name, 0) + layer.params
    copies = [kernel_cost(memory_op("copy", p, p, 2, 0.0, allocates=False, family="copy"),
                          gpu, cal).seconds for p in units.values() if p]
    assert per_parameter.forward.kernels == flat.forward.kernels + len(copies)
    assert per_parameter.backward.kernels == flat.backward.kernels + len(copies)
    for work_2, work_1 in ((per_parameter.forward, flat.forward),
                           (per_parameter.backward, flat.backward)):
        assert work_2.compute_s - work_1.compute_s == pytest.approx(sum(copies), rel=1e-9)


def test_nothing_is_copied_out_without_fsdp_units() -> None:
    for zero in (1, 2):
        assert _chunk("per_parameter", zero).forward == _chunk("flat", zero).forward
    assert _chunk("per_parameter", 3, True).backward == _chunk("flat", 3, True).backward


def test_stacks_name_their_fsdp() -> None:
    assert load_stack("torchtitan-2024").fsdp == "per_parameter"
    assert load_stack("llm-foundry-2023").fsdp == "flat"  # Composer wraps FSDP1
