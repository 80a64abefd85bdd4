"""Gradient buckets wait on their own layers' gradients (issue 15).

A backward pass completes its gradients in reverse layer order, so the token table's comes
last: PyTorch DDP's reducer fills 25 MiB buckets in that order (a tensor larger than a
bucket takes one of its own) and FSDP reduce-scatters a unit, a block, as its backward
ends. The last bucket is then the embedding's, reduced after the pass.
"""

from __future__ import annotations

import pytest

from gpusim.comm.topology import Topology
from gpusim.plan.parallel import plan_parallel
from gpusim.plan.parallel_job import ParallelConfig, ParallelJob
from gpusim.sim.clock import Clock
from gpusim.sim.collectives import DataParallel
from gpusim.workload.zoo.transformer import TransformerConfig, build_transformer

GPT = build_transformer(TransformerConfig(name="gpt-8l", layers=8, hidden=1024, heads=16,
                                          vocab=51200, seq_len=1024))


def _chunk_and_buckets(zero: int) -> tuple[object, list[tuple[float, float]]]:
    config = ParallelConfig(data=8, microbatch_size=2, zero=zero)
    job = ParallelJob(GPT, Topology.build("dgx-a100", 8), 16, config, "bf16", "adam", "none")
    chunk = plan_parallel(job).stages[0].chunks[0]
    dp = DataParallel(Clock(), config, 8, lambda *args: 0.0, [1.0], 4.0, 0.0, False, None)
    return chunk, dp._bucket_plan(chunk)


def test_gradients_complete_in_reverse_layer_order_the_embedding_last() -> None:
    chunk, _ = _chunk_and_buckets(0)
    ready = chunk.grad_ready
    assert sum(params for _, params, _ in ready) == chunk.trainable_params
    assert all(gap >= 0.0 for gap, _, _ in ready)
    # the token table (51,200 x 1,024, the tied head's weight too) completes last but one
    # or last, with the position table, in the embedding's block
    tail = [params for _, params, _ in ready[-2:]]
    assert 51200 * 1024 in tail and 1024 * 1024 in tail
    assert sum(1 for _, _, new_block in ready if new_block) == 8 + 2  # blocks, head, embed


def test_ddp_buckets_fill_in_order_and_the_embeddings_is_reduced_at_the_end() -> None:
    chunk, buckets = _chunk_and_buckets(0)
    assert sum(n for _, n in buckets) == pytest.approx(chunk.trainable_params * 4.0)
    times = [at for at, _ in buckets]
    assert times == sorted(times) and times[-1] == 1.0
    # the token table's gradient (200 MiB) fills a bucket of its own among the last two;
    # the others hold at most 25 MiB or one tensor larger than that
    table = 51200 * 1024 * 4.0
    assert table in [n for _, n in buckets[-2:]]
    assert max(n for _, n in buckets[:-2]) < table
    # evenly ready buckets of equal size (the old model) would have the last one small
    assert buckets[-1][1] != pytest.approx(chunk.trainable_params * 4.0 / len(buckets))


def test_fsdp_reduce_scatters_one_block_at_a_time() -> None:
    _, buckets = _chunk_and_buckets(3)
    assert len(buckets) == 8 + 2  # each block, the head's norm, the embedding
    block = (12 * 1024 * 1024 + 13 * 1024) * 4.0  # a GPT block's weights, biases and norms
    assert [n for _, n in buckets[1:-1]] == pytest.approx([block] * 8)
