"""FSDP2 copies each all-gather into its unit's parameters; FSDP1 does not. Both prepare
each unit's gradients for its reduce-scatter (issue 15).

torch.distributed.fsdp.fully_shard (FSDP2) keeps every parameter in its own storage, so a
unit's all-gather output is copied out into them (foreach_all_gather_copy_out,
split_with_sizes_copy) on the compute stream, once per gather: before the unit's forward
and again before its backward. FSDP1's FlatParameter makes the layers views into the
gathered buffer, and Megatron-style sharding (master weights) gathers no FSDP units.

Before a unit's reduce-scatter, FSDP2 copies its gradients into one input in the reduce type
(foreach_reduce_scatter_copy_in); FSDP1 gets them concatenated from autograd (its layers'
weights are split views of the FlatParameter), casts them to the reduce type and divides
them in place (_post_backward_hook, _reduce_grad's _div_if_needed).
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


def _job(fsdp: str, zero: int = 3, master_weights: bool = False,
         bf16_grads: bool = False) -> ParallelJob:
    stack = load_stack("pytorch").model_copy(update={"fsdp": fsdp})
    return ParallelJob(GPT, TOPOLOGY, 16, ParallelConfig(data=8, microbatch_size=2, zero=zero),
                       "bf16", "adam", "none", megatron=master_weights, stack=stack,
                       bf16_grads=bf16_grads)


def _chunk(fsdp: str, zero: int = 3, master_weights: bool = False) -> ChunkPlan:
    return plan_parallel(_job(fsdp, zero, master_weights)).stages[0].chunks[0]


def _unit_params() -> dict[str, int]:
    units: dict[str, int] = {}
    for layer in GPT.layers:
        units[layer.block or layer.name] = units.get(layer.block or layer.name, 0) + layer.params
    return {u: p for u, p in units.items() if p}


def _moved(params: int, bytes_per_param: float) -> float:
    gpu = TOPOLOGY.gpu
    op = memory_op("copy", params * bytes_per_param / 2, params * bytes_per_param / 2, 1.0, 0.0,
                   allocates=False, family="copy")
    return kernel_cost(op, gpu, calibration_for(gpu)).seconds


def _reduce_ops(job: ParallelJob) -> list[tuple[str, float, float]]:
    """The reduce-side copies of a whole-model chunk: (op, seconds, bytes moved)."""
    from gpusim.plan.chunk import chunk_job, chunk_ops
    from gpusim.plan.parallel import _shape
    cal = calibration_for(TOPOLOGY.gpu).sustained()
    layers = GPT.layers
    ops = chunk_ops(chunk_job(job, 0, layers), tuple(range(len(layers))), _shape(job, cal),
                    cal, {})
    return [(o[1], o[3], o[5]) for o in ops if o[1] == "fsdp_reduce_copy_in"]


def test_fsdp2_copies_each_units_gather_out_before_its_forward_and_its_backward() -> None:
    per_parameter, flat = _chunk("per_parameter"), _chunk("flat")
    units = _unit_params()
    copies = [_moved(p, 2 * 2) for p in units.values()]  # read and write, bf16
    assert per_parameter.forward.kernels == flat.forward.kernels + len(copies)
    assert per_parameter.backward.kernels == flat.backward.kernels + len(copies)
    assert per_parameter.forward.compute_s - flat.forward.compute_s == pytest.approx(
        sum(copies), rel=1e-9)
    # in backward, beside the copy-out, FSDP2's gradient copy-in (bf16 read, fp32 written:
    # 6 bytes a parameter) against FSDP1's concatenation, cast and divide (4 + 6 + 8)
    reduce_2 = sum(_moved(p, 6) for p in units.values())
    reduce_1 = sum(_moved(p, 18) for p in units.values())
    assert per_parameter.backward.compute_s - flat.backward.compute_s == pytest.approx(
        sum(copies) + reduce_2 - reduce_1, rel=1e-9)


def test_each_unit_prepares_its_gradients_for_the_reduce_scatter_once() -> None:
    units = _unit_params()
    for fsdp, bf16_grads, per_param in (("per_parameter", False, 6), ("per_parameter", True, 4),
                                        ("flat", False, 18), ("flat", True, 8)):
        ops = _reduce_ops(_job(fsdp, bf16_grads=bf16_grads))
        assert len(ops) == len(units), (fsdp, bf16_grads)
        assert sum(op[1] for op in ops) == pytest.approx(
            sum(_moved(p, per_param) for p in units.values()), rel=1e-9), (fsdp, bf16_grads)
    # nothing of the kind without FSDP units: ZeRO 1 and 2, or Megatron-style sharding
    assert not _reduce_ops(_job("flat", 1)) and not _reduce_ops(_job("flat", 2))
    assert not _reduce_ops(_job("flat", 3, master_weights=True))


def test_nothing_is_copied_out_without_fsdp_units() -> None:
    for zero in (1, 2):
        assert _chunk("per_parameter", zero).forward == _chunk("flat", zero).forward
    assert _chunk("per_parameter", 3, True).backward == _chunk("flat", 3, True).backward


def test_stacks_name_their_fsdp() -> None:
    assert load_stack("torchtitan-2024").fsdp == "per_parameter"
    assert load_stack("llm-foundry-2023").fsdp == "flat"  # Composer wraps FSDP1
