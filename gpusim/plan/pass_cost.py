"""The cost of one pass of a model chunk on its rank, for one microbatch (``Work``): its
kernels, the collectives between them and the host's dispatch, kept as terms in issue order
(``PassTerms``) so that a pass put together from parts adds up exactly as the pass costed
whole. The host dispatches into the GPU's queue (``Queue``) and carries its lead from one
pass to the next.
"""
from __future__ import annotations

import functools
import itertools
import operator
from collections import defaultdict
from dataclasses import dataclass, replace

from gpusim import units
from gpusim.comm.collectives import collective_seconds
from gpusim.comm.topology import CommGroup
from gpusim.cost.energy import active_seconds
from gpusim.cost.kernels import kernel_cost, op_host_extra
from gpusim.hardware.calibration import Calibration
from gpusim.hardware.profile import DeviceProfile
from gpusim.plan.context_parallel import cp_collectives
from gpusim.plan.lower import layer_kind
from gpusim.plan.parallel_job import DEDUP_DISPATCHERS, ParallelJob
from gpusim.plan.recompute import activation_only
from gpusim.plan.tensor_parallel import tp_collectives
from gpusim.stack import Stack, runs_compiled
from gpusim.workload.layers import Layer, Linear
from gpusim.workload.moe import ep_collectives
from gpusim.workload.numerics import Numerics
from gpusim.workload.ops import DTYPE_BYTES, Op, gemm_op, memory_op


@dataclass(frozen=True)
class Work:
    """One forward or backward pass of one model chunk for one microbatch, on one rank.

    ``compute_s`` is kernel time (recompute included; ``recompute_s`` is its part),
    ``tp_comm_s`` the tensor-parallel collectives on the critical path between those kernels,
    ``host_s`` the time to dispatch them; the pass lasts ``duration_s``.
    """

    compute_s: float
    recompute_s: float
    tp_comm_s: float
    host_s: float
    flops: float
    kernels: int
    active_s: float  # kernel time at the roofline limit (see cost/energy.py)
    # Context-parallel K/V gathers and gradient reduce-scatters, before and after attention.
    cp_comm_s: float = 0.0
    # Expert-parallel all-to-alls, sending tokens to their experts' ranks and back: what is
    # left exposed (ep_hidden_s below: under --ep-overlap, what ran beside compute).
    ep_comm_s: float = 0.0
    # Time the device waits for the host within the pass: where the host dispatches more
    # slowly than short kernels run, the queue runs dry (as the one-device engine finds it).
    stall_s: float = 0.0
    # How far the host had run ahead into this pass while the device finished the last one.
    host_lead_s: float = 0.0
    # Under --ep-overlap, the all-to-alls' time that ran beside the other microbatch's
    # compute (not exposed), which slows that compute (the simulator's comm_slowdown).
    ep_hidden_s: float = 0.0

    @property
    def duration_s(self) -> float:
        # The host queues kernels ahead of the GPU; where it falls behind, the GPU waits.
        return max(self.compute_s + self.tp_comm_s + self.cp_comm_s + self.ep_comm_s
                   + self.stall_s, self.host_s - self.host_lead_s)


# An op as a pass's accounting sees it: (layer, name suffix, phase, seconds, active
# seconds, FLOPs, host seconds beyond the per-op dispatch, whether the host waits for the
# device before dispatching it).
Costed = tuple[str, str, str, float, float, float, float, bool]


def costed_ops(ops: list[Op], device: DeviceProfile, cal: Calibration) -> list[Costed]:
    out: list[Costed] = []
    for op in ops:
        kc = kernel_cost(op, device, cal)
        out.append((op.layer, op.name.rsplit(".", 1)[-1], op.phase, kc.seconds,
                    active_seconds(kc), op.flops, op_host_extra(op, cal), op.syncs))
    return out


def grad_ready(ops: list[Costed], layers: dict[str, Layer], job: ParallelJob
               ) -> tuple[tuple[tuple[float, int, bool], ...], float]:
    """When each trained layer's gradient is complete within a backward pass (see
    ``ChunkPlan.grad_ready``), from the pass's ops in order; and the kernel seconds after
    the last one."""
    last = {op[0]: i for i, op in enumerate(ops)}
    out = []
    gap, block = 0.0, None
    for i, op in enumerate(ops):
        gap += op[3]
        layer = layers.get(op[0])
        if layer is not None and last[op[0]] == i:
            params = job.trainable_params((layer,))
            if params:
                out.append((gap, params, (layer.block or layer.name) != block))
                gap, block = 0.0, layer.block or layer.name
    return tuple(out), gap


@dataclass(frozen=True)
class PassTerms:
    """What a pass's totals add up, term by term in issue order: kernel by kernel, and
    collective by collective for the collectives. A pass of several blocks is its parts'
    terms one after another, so totals summed from joined terms equal those of the pass
    costed whole, to the last bit (float addition depends on its order)."""

    device: tuple[float, ...]  # kernel seconds
    active: tuple[float, ...]  # kernel seconds at the roofline limit
    recompute: tuple[float, ...]  # kernel seconds of the recompute kernels
    flops: tuple[float, ...]  # FLOPs of the other kernels
    host: tuple[float, ...]  # dispatch seconds, before the backward() call is charged
    backward_at: int  # the kernel charged the backward() call (-1: none)
    tp: tuple[float, ...]  # exposed seconds of each tensor-parallel collective
    cp: tuple[float, ...]  # seconds of each context-parallel collective
    ep: tuple[float, ...]  # seconds of each expert-parallel all-to-all
    syncs: tuple[bool, ...] = ()  # per kernel: the host waits for the device first
    # per kernel: seconds of all-to-alls the device runs from it on (its layer's, where the
    # host, waiting on the device or behind it, may catch up meanwhile)
    ep_at: tuple[float, ...] = ()


def joined(parts: list[PassTerms]) -> PassTerms:
    """The terms of parts run one after another."""
    backward_at, offset = -1, 0
    for part in parts:
        if part.backward_at >= 0:
            backward_at = offset + part.backward_at
            break
        offset += len(part.device)

    def chain(field: str) -> tuple[float, ...]:
        return tuple(itertools.chain.from_iterable(getattr(t, field) for t in parts))

    return PassTerms(chain("device"), chain("active"), chain("recompute"), chain("flops"),
                     chain("host"), backward_at, chain("tp"), chain("cp"), chain("ep"),
                     tuple(itertools.chain.from_iterable(t.syncs for t in parts)),
                     tuple(itertools.chain.from_iterable(t.ep_at for t in parts)))


def added(terms: tuple[float, ...]) -> float:
    """Terms added left to right from 0.0, as a ``+=`` loop adds them (the builtin sum
    compensates rounding from Python 3.12 on)."""
    return functools.reduce(operator.add, terms, 0.0)


def pass_groups(job: ParallelJob) -> tuple[CommGroup, CommGroup, CommGroup]:
    """The groups a pass's collectives cross: tensor, context and expert parallel."""
    p = job.parallel
    return (job.topology.place(p.tensor, stride=1),
            job.topology.place(p.context, stride=p.tensor), expert_group(job))


def pass_terms(ops: list[Costed], layers: dict[str, Layer], job: ParallelJob,
                cal: Calibration, host_per_op: float, act: int,
                fp8: frozenset[str] = frozenset(),
                groups: tuple[CommGroup, CommGroup, CommGroup] | None = None) -> PassTerms:
    """The terms of a pass: kernels in order, each layer's tensor-parallel collectives after
    it (the ``fp8`` layers gather their inputs already cast: tp_collectives)."""
    p = job.parallel
    n = p.microbatch_size
    tp_group, cp_group, ep_group = groups or pass_groups(job)
    # Seconds of each layer's GEMMs by kind ("dgrad", "wgrad") that a collective may hide behind.
    gemm_s: dict[tuple[str, str], float] = defaultdict(float)
    passes: dict[tuple[str, str], None] = {}  # (phase, layer) in order of first kernel
    # where each (phase, layer)'s all-to-alls start in the device's queue: at the kernel the
    # host waits before (the dispatch follows the token counts), else at its first kernel
    starts: dict[tuple[str, str], int] = {}
    recompute, flops = [], []
    for i, (layer, suffix, phase, cost, _, op_flops, _, syncs) in enumerate(ops):
        if phase == "recompute":
            recompute.append(cost)
        else:
            flops.append(op_flops)
        gemm_s[(layer, suffix)] += cost
        if layer in layers:
            passes.setdefault((phase, layer))
            if syncs or (phase, layer) not in starts:
                starts[(phase, layer)] = i
    tp: list[float] = []
    cp: list[float] = []
    ep: list[float] = []
    ep_at = [0.0] * len(ops)
    # PyTorch's DTensor parallelism keeps a column layer's gathered input for backward
    kept = job.whole.framework.tensor_parallel == "dtensor"
    # DeepEP (and HybridEP) send a token once per destination node across nodes, once per
    # rank inside one
    dedup = ((ep_group.num_nodes if ep_group.spans_nodes else ep_group.size)
             if p.ep_dispatcher in DEDUP_DISPATCHERS else 0)
    for phase, name in passes:
        if phase == "recompute" and activation_only(layers[name], job.checkpointing):
            continue  # nothing to exchange
        gathered = DTYPE_BYTES["fp8"] if name in fp8 else None  # recompute gathers again
        for collective, size, beside in tp_collectives(layers[name], phase, n, act, p.tensor,
                                                       p.sequence_parallel, p.tp_overlap,
                                                       gathered, kept):
            seconds = collective_seconds(collective, tp_group, size)
            hidden = gemm_s.get((name, beside), 0.0) if beside else 0.0
            if p.tp_overlap and beside:
                # split into TP chunks pipelined with the product: one chunk stays exposed
                exposed = max(seconds / p.tensor, seconds - hidden)
                if kept:  # PyTorch's async TP: its own copies, sum and shard products
                    exposed += async_tp_passes(collective, size, p.tensor,
                                               job.topology.gpu, cal)
                    exposed += shard_products_s(layers[name], beside, n, p.tensor,
                                                _numerics(job, name in fp8),
                                                job.topology.gpu, cal)
                tp.append(exposed)
            else:
                tp.append(max(0.0, seconds - hidden))
        for collective, size in cp_collectives(layers[name], phase, n, act):
            cp.append(collective_seconds(collective, cp_group, size))
        for collective, size in ep_collectives(layers[name], phase, n, act, dedup):
            ep.append(collective_seconds(collective, ep_group, size))
            ep_at[starts[(phase, name)]] += ep[-1]
    host, backward_at = host_seconds(ops, layers, cal, host_per_op, job.whole.framework)
    return PassTerms(tuple(op[3] for op in ops), tuple(op[4] for op in ops), tuple(recompute),
                     tuple(flops), tuple(host), backward_at, tuple(tp), tuple(cp), tuple(ep),
                     tuple(op[7] for op in ops), tuple(ep_at))


def async_tp_passes(collective: str, size: float, tensor: int, device: DeviceProfile,
                    cal: Calibration) -> float:
    """Seconds of the memory passes PyTorch's micro-pipelined TP adds to a collective it fuses
    with a product (torch/distributed/_symmetric_memory/__init__.py): an all-gather-matmul
    first copies the local shard into the symmetric buffer, before the pipeline starts
    (_pipelined_multi_all_gather_and_consume: "giving up the chance to overlap"), and the
    shard into the gathered output after it; a matmul-reduce-scatter sums the ranks' partial
    outputs once they arrive (_fused_matmul_reduce_scatter_impl: torch.sum over the stacked
    partials, the whole product output read, a shard written), where NCCL reduces inside
    its collective. ``size``: the collective's full buffer in bytes."""
    shard = size / tensor
    if collective == "all_gather":
        read, written = 2 * shard, 2 * shard
    elif collective == "reduce_scatter":
        read, written = size, shard
    else:
        return 0.0
    op = memory_op("async_tp_pass", read, written, 1.0, 0.0, allocates=False, family="copy")
    return kernel_cost(op, device, cal).seconds


def shard_products_s(layer: Layer, beside: str, n: int, tensor: int, num: Numerics,
                     device: DeviceProfile, cal: Calibration) -> float:
    """Seconds PyTorch's micro-pipelined TP adds by running a fused product shard by shard:
    the all-gather-matmul multiplies each rank's rows as they arrive and the matmul-reduce-
    scatter computes each rank's rows apart (torch/distributed/_symmetric_memory:
    shard_consumer and chunk_producer run one matmul per rank), ``tensor`` products of 1/TP
    of the rows in place of one, each with its own last, partly filled wave."""
    if not isinstance(layer, Linear):
        return 0.0
    ops = layer.forward(n, num) if beside == "fwd" else layer.backward_input(n, num)
    product = next((op for op in ops if op.kind == "gemm" and op.gemm is not None), None)
    if product is None or product.gemm is None:
        return 0.0
    whole = kernel_cost(product, device, cal).seconds
    shard = gemm_op(product.name, replace(product.gemm, m=-(-product.gemm.m // tensor)),
                    product.math, num.act_bytes, layer=product.layer)
    return max(0.0, tensor * kernel_cost(shard, device, cal).seconds - whole)


def _numerics(job: ParallelJob, fp8: bool) -> Numerics:
    """A layer's numerics: the job's, with products in bf16 where the layer is not fp8."""
    num = job.whole.numerics()
    return num if fp8 or num.matmul != "fp8" else replace(num, matmul="bf16")


def pass_work(terms: PassTerms, job: ParallelJob, cal: Calibration,
          queue: Queue | None = None) -> Work:
    """Cost a pass from its terms."""
    compute = added(terms.device)
    ep_comm = added(terms.ep)
    ep_hidden = 0.0
    if job.parallel.ep_overlap:
        # the other microbatch's compute runs while these all-to-alls are in flight; this
        # pass's compute stands for it (pipeline warm-up and cool-down have no partner).
        # The compute beside them runs slower, as beside any collective (the simulator's
        # comm_slowdown on ep_hidden_s).
        ep_hidden = min(ep_comm, compute)
        ep_comm = max(0.0, ep_comm - compute)
    host = list(terms.host)
    if terms.backward_at >= 0:
        host[terms.backward_at] += units.us(cal.overhead.backward_call_us)
    queue = queue or Queue()
    lead = queue.lead_s
    return Work(compute, added(terms.recompute), added(terms.tp), sum(host),
                added(terms.flops), len(terms.device), added(terms.active), added(terms.cp),
                ep_comm, queue.run(host, _queued(terms), terms.syncs), lead, ep_hidden)


def _queued(terms: PassTerms) -> list[float]:
    """The device's time from each kernel to the next as the host's queue sees it: its own
    time, and the all-to-alls that start there (under --ep-overlap the other microbatch's
    compute runs beside them; the device is as busy)."""
    if not any(terms.ep_at):
        return list(terms.device)
    return [d + e for d, e in zip(terms.device, terms.ep_at, strict=True)]


@dataclass
class Queue:
    """The host dispatching kernels into the GPU's queue, one after another (host[i]; the
    kernel then runs device[i] once the one before it is done), as the one-device engine
    runs them. It carries over from a pass to the next, so a host that ran ahead during a
    device-bound forward has a lead when the backward starts."""

    dispatched: float = 0.0
    done: float = 0.0

    @property
    def lead_s(self) -> float:
        """How far the host has run ahead: device work queued that it has not waited for."""
        return max(0.0, self.done - self.dispatched)

    def run(self, host: list[float], device: list[float],
            syncs: tuple[bool, ...] = ()) -> float:
        """Seconds the device idles, waiting for the host, over these kernels; before a
        kernel that ``syncs``, the host waits for the device to finish what it queued, so
        it dispatches what follows from no lead."""
        idle = 0.0
        dispatched, done = self.dispatched, self.done
        for i, (h, d) in enumerate(zip(host, device, strict=True)):
            if syncs and syncs[i]:
                dispatched = max(dispatched, done)
            dispatched += h
            if dispatched > done:
                idle += dispatched - done
                done = dispatched
            done += d
        self.dispatched, self.done = dispatched, done
        return idle


def host_seconds(ops: list[Costed], layers: dict[str, Layer], cal: Calibration,
                  host_per_op: float, stack: Stack | None = None) -> tuple[list[float], int]:
    """What the host spends dispatching each op of a pass, as the single-device lowering
    charges it: the op's dispatch, and at a layer's first op its Python and autograd nodes
    (a compiled block's kernels: their launch alone); and which op is the pass's first
    backward op, charged the backward() call on top (-1: none)."""
    o = cal.overhead
    seen: set[tuple[str, str]] = set()
    backward_at = -1
    out = []
    compiled = ({name for name, la in layers.items() if runs_compiled(la, stack)}
                if stack is not None and stack.compiled else set())
    launch = units.us(o.launch_us)
    calls: dict[tuple[str, str], float] = {}
    for i, (layer, _, phase, _, _, _, extra, _) in enumerate(ops):
        if layer in compiled:
            # a compiled block: each kernel launched from its graph, no Python per op
            out.append(launch + extra)
            continue
        host = host_per_op + extra
        if (phase, layer) not in seen and layer in layers:
            seen.add((phase, layer))
            kind = (layer_kind(layers[layer]), phase)
            if kind not in calls:
                calls[kind] = units.us(o.layer_call_us(*kind))
            host += calls[kind]
        if phase == "backward" and backward_at < 0:
            backward_at = i
        out.append(host)
    return out, backward_at


def expert_group(job: ParallelJob) -> CommGroup:
    """The ranks that exchange tokens: adjacent data-parallel ranks, or, when EP folds over
    tensor-parallel ranks too (experts split over fewer ranks than TP), adjacent ranks from
    the innermost."""
    p = job.parallel
    stride = p.tensor if p.expert <= p.data and p.expert_tensor == p.tensor else 1
    return job.topology.place(p.expert, stride=stride)
