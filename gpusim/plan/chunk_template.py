"""A chunk of identical blocks put together from a template of three of them: the parts
(leading layers, first block, a later block, trailing layers) are costed once and added up
term by term in the order the whole chunk would add them, so the totals are the same to the
last bit as costing the chunk whole (``chunk.chunk_plan``), at a fraction of the work.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from gpusim.hardware.calibration import Calibration
from gpusim.plan.chunk import (
    ChunkLayout,
    ChunkPlan,
    chunk_job,
    chunk_ops,
    fp8_layers,
    sent_bytes,
)
from gpusim.plan.memory import activations_by_layer
from gpusim.plan.parallel_job import ParallelJob
from gpusim.plan.pass_cost import (
    Costed,
    PassTerms,
    Queue,
    grad_ready,
    joined,
    pass_groups,
    pass_terms,
    pass_work,
)
from gpusim.workload.layers import Layer

# A chunk of at least three identical blocks is assembled from a template of three of them
# (see chunk_template), costed once and shared with chunks of other sizes; a chunk of two is
# assembled where a larger one left its template, and one of a single block costed whole.
TEMPLATE_BLOCKS = 3


@dataclass(frozen=True)
class _Part:
    """What one part of a chunk (its leading layers, a block, its trailing layers) adds to
    the chunk's plan, costed where it sits."""

    forward: PassTerms
    backward: PassTerms
    kept: tuple[float, ...]  # activations it keeps for backward, entry by entry
    params: int
    trainable_params: int
    # its gradients as ChunkPlan.grad_ready counts them, and the kernel seconds after them
    grad_ready: tuple[tuple[float, int, bool], ...]
    grad_rest: float


@dataclass(frozen=True)
class Template:
    """A chunk's parts, costed once on the chunk's leading layers, three of its blocks and
    its trailing layers: the leading layers, the first block (whose neighbour before it
    differs), a later block (the second and third cost alike, checked), and the trailing
    layers. A chunk of any number of those blocks is these parts put together."""

    lead: _Part
    first: _Part
    block: _Part
    tail: _Part
    working_bytes: float
    largest_block_params: int
    act_bytes: int


def chunk_template(index: int, layers: tuple[Layer, ...], signature: tuple[int, ...],
              layout: ChunkLayout, shape: tuple[Any, ...], job: ParallelJob, cal: Calibration,
              host_per_op: float, cache: dict[Any, Any]) -> Template | None:
    """The parts of a chunk of identical blocks (``layout``), from three of them; None where
    the parts do not come apart in order or the second and third blocks differ (the chunk
    is then costed whole)."""
    size = layout.lead + 3 * layout.block
    keep = list(range(size)) + list(range(len(layers) - layout.tail, len(layers)))
    t_layers = tuple(layers[i] for i in keep)
    t_signature = tuple(signature[i] for i in keep)
    part_of = {la.name: (0 if i < layout.lead else 4 if i >= size
                         else 1 + (i - layout.lead) // layout.block)
               for i, la in enumerate(t_layers)}
    stage_job = chunk_job(job, index, t_layers)
    ops = chunk_ops(stage_job, t_signature, shape, cal, cache)
    by_name = {la.name: la for la in t_layers}
    act = stage_job.numerics().act_bytes
    fp8 = fp8_layers(stage_job)
    groups = pass_groups(job)

    def runs_of(pass_ops: list[Costed], order: list[int]) -> list[list[Costed]] | None:
        """The pass's ops part by part, where they run part after part in ``order``."""
        runs: list[list[Costed]] = [[] for _ in range(5)]
        at = 0
        for op in pass_ops:
            part = part_of.get(op[0], -1)
            if part not in order[at:]:
                return None  # not one of the parts, or one that already ran
            at = order.index(part)
            runs[part].append(op)
        return runs

    def parts(runs: list[list[Costed]] | None) -> list[PassTerms] | None:
        return None if runs is None else [
            pass_terms(run, by_name, job, cal, host_per_op, act, fp8, groups) for run in runs]

    forward = parts(runs_of([op for op in ops if op[2] == "forward"], [0, 1, 2, 3, 4]))
    backward_runs = runs_of([op for op in ops if op[2] != "forward"], [4, 3, 2, 1, 0])
    backward = parts(backward_runs)
    entries, working = activations_by_layer(stage_job)
    block_part = {la.block: part_of[la.name] for la in t_layers if la.block}
    kept: list[list[float]] = [[] for _ in range(5)]
    order = []
    for name, value in entries.items():
        part = part_of.get(name, block_part.get(name.removesuffix(".input"), -1))
        order.append(part)
        if part >= 0:
            kept[part].append(value)
    if (forward is None or backward is None or -1 in order or order != sorted(order)
            or any(not isinstance(la.params, int) for la in t_layers)):
        return None
    assert backward_runs is not None
    pieces = []
    for k in range(5):
        members = [la for la in t_layers if part_of[la.name] == k]
        pieces.append(_Part(forward[k], backward[k], tuple(kept[k]),
                            sum(la.params for la in members), job.trainable_params(members),
                            *grad_ready(backward_runs[k], by_name, job)))
    if pieces[2] != pieces[3]:
        return None
    blocks: dict[str, int] = {}
    for la in t_layers:
        blocks[la.block or la.name] = blocks.get(la.block or la.name, 0) + la.params
    return Template(pieces[0], pieces[1], pieces[2], pieces[4], working,
                     max(blocks.values()), act)


def assembled_chunk(t: Template, index: int, layers: tuple[Layer, ...], blocks: int,
               job: ParallelJob, cal: Calibration) -> ChunkPlan:
    """A chunk of ``blocks`` blocks (two or more) put together from its template's parts,
    term by term in the order the chunk runs them."""
    rest = blocks - 1
    queue = Queue()
    forward = pass_work(joined([t.lead.forward, t.first.forward]
                            + [t.block.forward] * rest + [t.tail.forward]), job, cal, queue)
    backward = pass_work(joined([t.tail.backward] + [t.block.backward] * rest
                             + [t.first.backward, t.lead.backward]), job, cal, queue)
    kept = sum(itertools.chain(t.lead.kept, t.first.kept,
                               itertools.chain.from_iterable([t.block.kept] * rest),
                               t.tail.kept))
    params = t.lead.params + t.first.params + rest * t.block.params + t.tail.params
    trainable = (t.lead.trainable_params + t.first.trainable_params
                 + rest * t.block.trainable_params + t.tail.trainable_params)
    # the parts' gradients in the order backward runs them, each part's kernels after its
    # last gradient added to the next part's first (parts hold different blocks)
    ready: list[tuple[float, int, bool]] = []
    carry = 0.0
    for part in [t.tail] + [t.block] * rest + [t.first, t.lead]:
        entries = list(part.grad_ready)
        if entries and carry:
            entries[0] = (carry + entries[0][0], *entries[0][1:])
        ready += entries
        carry = part.grad_rest if entries else carry + part.grad_rest
    return ChunkPlan(index, layers, forward, backward, sent_bytes(job, layers, t.act_bytes),
                     kept, t.working_bytes, params, trainable, t.largest_block_params,
                     forward.flops + backward.flops, tuple(ready), queue.lead_s)
