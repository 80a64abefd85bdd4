"""Search over parallel configurations: every valid TP/PP/DP/microbatch/ZeRO/recompute/
schedule combination for a model on N GPUs (with expert parallelism for mixtures of experts
and context parallelism for long sequences), ranked by predicted step time.

Thousands of combinations are ranked with the closed-form pipeline time (the 1F1B formula
over the slowest stage, plus the exposed data-parallel reduction and the optimizer), from the
same per-pass costs the simulator uses; the best ``top`` are then simulated in full. Passes
are costed once per distinct (TP, PP, microbatch, recompute, sequence-parallel) shape and
shared by the ZeRO and schedule variants. Configurations that do not fit are set aside with
the reason.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

from gpusim.comm.topology import Topology
from gpusim.errors import GpusimError, OutOfMemory
from gpusim.estimation import mfu_peak, simulate_parallel_step
from gpusim.hardware.calibration import calibration_for
from gpusim.plan.job import (
    AUTO_PRECISION,
    Checkpointing,
    Optimizer,
    TrainingPrecision,
    auto_precision,
)
from gpusim.plan.parallel import ParallelPlan, plan_parallel, tied_embedding_params
from gpusim.plan.parallel_job import ParallelConfig, ParallelJob
from gpusim.plan.remedies import check_fits_parallel
from gpusim.plan.stage_memory import stage_memory
from gpusim.workload.attention import Attention
from gpusim.workload.model import Model
from gpusim.workload.moe import MoE

# A transformer's GEMMs are large at a few sequences a microbatch; a CNN's or an MLP's need
# hundreds of samples, so theirs run in powers of two up to what a replica holds (capped).
MICROBATCHES = (1, 2, 4, 8, 16)
LARGEST_SAMPLE_MICROBATCH = 1024
RECOMPUTE: tuple[Checkpointing, ...] = ("none", "selective", "per-op", "full")
# Most model chunks per stage the search tries for interleaved 1F1B: V chunks cut the bubble
# to (PP - 1) / V passes but send V times as many activations (SC'21 Table 1 ran V of 2-3).
MAX_VIRTUAL_STAGES = 8
# Sequences from this long on are also tried with context parallelism (torchtitan turns it on
# for 32K and longer; below 16K attention is too small a share to gain from it).
LONG_SEQUENCE = 16384


@dataclass(frozen=True)
class Ranked:
    """One configuration that fits, with its predicted step."""

    config: ParallelConfig
    checkpointing: Checkpointing
    step_time_s: float
    simulated: bool  # True: from the SimPy simulation; False: the closed form
    peak_memory_bytes: float
    mfu: float
    # fits only if its tensors fragment less than most runs' do (MemoryPlan.tight)
    tight: bool = False

    def to_json(self, *, batch: int, tokens: int | None, usd_per_gpu_hour: float | None,
                num_gpus: int) -> dict[str, Any]:
        c = self.config
        cost = (usd_per_gpu_hour * num_gpus * self.step_time_s / 3600
                if usd_per_gpu_hour is not None else None)
        return {"tp": c.tensor, "pp": c.pipeline, "dp": c.data // c.context,
                "cp": c.context, "ep": c.expert,
                "microbatch_size": c.microbatch_size, "schedule": c.schedule,
                "virtual_stages": c.virtual_stages, "zero": c.zero,
                "sequence_parallel": c.sequence_parallel, "recompute": self.checkpointing,
                "step_time_s": self.step_time_s, "simulated": self.simulated,
                "samples_per_s": batch / self.step_time_s,
                "tokens_per_s": batch * tokens / self.step_time_s if tokens else None,
                "cost_per_step_usd": cost, "peak_memory_per_gpu_bytes": self.peak_memory_bytes,
                "memory_tight": self.tight, "mfu": self.mfu}


@dataclass(frozen=True)
class SearchResult:
    ranked: tuple[Ranked, ...]  # best first
    rejected: tuple[tuple[str, str], ...]  # (configuration, why)
    considered: int
    elapsed_s: float
    dominated: int = 0  # a lighter recompute of the same split fits and is faster
    precision: str = ""  # what the configurations train in ("auto" resolved)


def _divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, found in O(sqrt n)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def candidates(model: Model, topology: Topology, batch: int) -> Iterator[
        tuple[ParallelConfig, Checkpointing]]:
    """Every combination worth trying: TP within a node and dividing the heads, PP dividing
    the blocks, DP the rest; ZeRO 2 and 3 only without pipeline parallelism."""
    heads = next((la.heads for la in model.layers if isinstance(la, Attention)), 1)
    blocks = len(model.partition()[1])
    transformer = model.family == "transformer"
    # Selective recompute re-runs attention cores only: without them it is no recompute;
    # the per-op policy saves attention and matrix-product outputs: without attention
    # blocks (a CNN's) it re-runs what full recompute does.
    recomputes = RECOMPUTE if any(isinstance(la, Attention) for la in model.layers) else tuple(
        r for r in RECOMPUTE if r not in ("selective", "per-op"))
    tps = [t for t in _divisors(topology.gpus_per_node)
           if heads % t == 0 and (transformer or t == 1)]
    experts = next((la.experts for la in model.layers if isinstance(la, MoE)), 0)
    for tp in tps:
        for pp in _divisors(topology.num_gpus // tp):
            if pp > 1 and (not transformer or blocks % pp):
                continue
            ranks = topology.num_gpus // (tp * pp)  # data ranks, context ranks among them
            for cp, ep in itertools.product(_contexts(model, ranks, tp, topology),
                                            [e for e in _divisors(ranks)
                                             if e == 1 or (experts and experts % e == 0)]):
                yield from _splits(model, batch, tp, pp, ranks, cp, ep, blocks, recomputes)


def _contexts(model: Model, ranks: int, tp: int, topology: Topology) -> list[int]:
    """Context-parallel sizes worth trying: for sequences of 16K tokens and more, those that
    split the sequence into two chunks a rank and stay inside a node with TP."""
    seq = model.tokens_per_sample or 0
    if model.family != "transformer" or seq < LONG_SEQUENCE:
        return [1]
    return [c for c in _divisors(ranks)
            if c == 1 or (seq % (2 * c) == 0 and c * tp <= topology.gpus_per_node)]


def _splits(model: Model, batch: int, tp: int, pp: int, ranks: int, cp: int, ep: int,
            blocks: int, recomputes: tuple[Checkpointing, ...]
            ) -> Iterator[tuple[ParallelConfig, Checkpointing]]:
    dp = ranks // cp  # ranks that take samples of their own
    for mb in _microbatches(model, batch // dp):
        if batch % (mb * dp):
            continue
        micro = batch // (mb * dp)
        schedules = [("1f1b", 1)]
        if pp > 1 and micro % pp == 0:  # Megatron-LM's condition for interleaving
            schedules += [("interleaved", v) for v in _divisors(blocks // pp)[1:]
                          if v <= MAX_VIRTUAL_STAGES]
        zeros = (0, 1) if pp > 1 else (0, 1, 2, 3)
        sps = (False, True) if tp > 1 else (False,)
        for (sched, v), zero, sp, rec in itertools.product(schedules, zeros, sps, recomputes):
            if ranks == 1 and zero:
                continue
            yield (ParallelConfig(tensor=tp, pipeline=pp, data=ranks, microbatch_size=mb,
                                  schedule=sched, virtual_stages=v, zero=zero,  # type: ignore[arg-type]
                                  sequence_parallel=sp, context=cp, expert=ep), rec)


def _microbatches(model: Model, per_replica: int) -> tuple[int, ...]:
    if model.tokens_per_sample:
        return MICROBATCHES
    cap = min(per_replica, LARGEST_SAMPLE_MICROBATCH)
    return tuple(2**i for i in range(cap.bit_length()) if 2**i <= cap)


def closed_form_step(plan: ParallelPlan) -> float:
    """Step time without the event simulation: M microbatches through p stages take
    (M + (p - 1) / v) passes of the slowest stage, plus transfers, the exposed gradient
    reduction and the optimizer, and no less than the loaders need. Exact for uniform stages
    and free transfers (the simulator's 1F1B test checks the same formula)."""
    job = plan.job
    p = job.parallel
    m, stages, v = job.microbatches, p.pipeline, p.virtual_stages
    grad = job.whole.reduce_bytes  # as the gradients travel
    weight = job.whole.weight_bytes
    optimizer = max(st.optimizer_s for st in plan.stages)
    if p.zero >= 2 and p.data > 1:
        # No pipeline (ZeRO 2 and 3 refuse it). Every backward reduce-scatters its gradients
        # and, under ZeRO-3, every pass gathers the weights, on one communication stream.
        st = plan.stages[0]
        fwd = sum(c.forward.duration_s for c in st.chunks)
        bwd = sum(c.backward.duration_s for c in st.chunks)
        rs = plan.collective_s("reduce_scatter", "data", st.trainable_params * grad)
        gathered = job.gathered_weight_bytes
        ag = plan.collective_s("all_gather", "data", st.params * gathered) if p.zero == 3 else 0.0
        step = m * (max(fwd, ag) + max(bwd, ag + rs)) + optimizer
        if p.zero == 3:
            block = max(c.largest_block_params for c in st.chunks)
            step += plan.collective_s("all_gather", "data", block * gathered)
        else:
            step += plan.collective_s("all_gather", "data", st.trainable_params * weight)
        return max(step, m * job.input_interval_s)
    per_stage = [sum(c.forward.duration_s + c.backward.duration_s for c in st.chunks)
                 for st in plan.stages]
    slowest = max(per_stage)
    pipeline = m * slowest + (stages - 1) * slowest / v + 2 * (stages - 1) * plan.p2p_s
    worst = max(plan.stages, key=lambda st: st.trainable_params)
    exposed = 0.0
    if p.data > 1:
        last_backward = max(c.backward.duration_s for c in worst.chunks)
        reduce = plan.collective_s("reduce_scatter" if p.zero else "all_reduce", "data",
                                   worst.trainable_params * grad)
        exposed = max(0.0, reduce - last_backward) if p.overlap_grad_reduce else reduce
        if p.zero:
            exposed += plan.collective_s("all_gather", "data",
                                         worst.trainable_params * weight)
    tied = tied_embedding_params(job, plan.cache)
    if tied:
        exposed += plan.collective_s("all_reduce", "embedding", tied * grad)
    return max(pipeline + exposed + optimizer, m * job.input_interval_s)


def search(model: Model, topology: Topology, batch: int, *,
           precision: TrainingPrecision | Literal["auto"] = "auto", optimizer: Optimizer = "adam",
           top: int = 10,
           loader_workers: int = 0,
           progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Rank every valid configuration of ``model`` on ``topology`` for global ``batch``
    (``loader_workers`` per data-parallel replica; 0 feeds synthetic input)."""
    start = time.perf_counter()
    chosen: TrainingPrecision = (auto_precision(topology.gpu) if precision == AUTO_PRECISION
                                 else precision)  # type: ignore[assignment]
    options = list(candidates(model, topology, batch))
    chunk_cache: dict[Any, Any] = {}
    cal = calibration_for(topology.gpu)  # the same for every job: looked up once
    fits: list[tuple[float, ParallelJob, float, bool]] = []
    rejected: list[tuple[str, str]] = []
    # Recompute modes come in order of the work they re-run; once a split fits with one,
    # the later ones can only be slower.
    fitted: set[ParallelConfig] = set()
    dominated = 0
    # Memory does not shrink as the microbatch grows (activations and buffers grow with it;
    # what a pipeline holds in flight, microbatch x min(stages, microbatches), too), and the
    # microbatches come smallest first: a split that does not fit at one microbatch is not
    # planned again at a larger one.
    too_big: dict[tuple[Any, ...], int] = {}
    for i, (config, rec) in enumerate(options):
        if progress:
            progress(i, len(options))
        if config in fitted:
            dominated += 1
            continue
        label = f"{config.describe()}, recompute {rec}"
        split = (replace(config, microbatch_size=1), rec)
        if split in too_big:
            rejected.append((label, f"does not fit: microbatch {too_big[split]} of this "
                                    f"split does not either"))
            continue
        try:
            job = ParallelJob(model, topology, batch, config, chosen, optimizer, rec,
                              loader_workers=loader_workers)
            plan = plan_parallel(job, cal, cache=chunk_cache)
            edges = {0, len(plan.stages) - 1}  # the first stage keeps most activations
            mems = [stage_memory(plan, plan.stages[s]) for s in sorted(edges)]
            check_fits_parallel(job, mems)
        except OutOfMemory as exc:
            too_big[split] = config.microbatch_size
            rejected.append((label, exc.summary.split(";")[0]))
            continue
        except GpusimError as exc:
            rejected.append((label, exc.summary.split(";")[0]))
            continue
        fitted.add(config)
        fits.append((closed_form_step(plan), job, max(m.peak_bytes for m in mems),
                     any(m.tight for m in mems)))
    if progress:
        progress(len(options), len(options))
    fits.sort(key=lambda f: f[0])
    # The best plans and their stages' memory, then the search's costs let go: the
    # simulations allocate hundreds of thousands of events, and each of Python's full
    # collections meanwhile walks whatever is still alive.
    best = []
    for _, job, _, _ in fits[:top]:
        plan = plan_parallel(job, cal, cache=chunk_cache)
        best.append((plan, [stage_memory(plan, stage) for stage in plan.stages]))
    chunk_cache.clear()
    ranked = []
    flops = batch * model.training_flops_per_sample
    peaks: dict[Any, float] = {}  # the MFU's peak, by the numerics it is taken at
    for k, (seconds, job, peak, tight) in enumerate(fits):
        simulated = k < top
        if simulated:
            step = simulate_parallel_step(job, trace=False, planned=best[k])
            seconds, peak, mfu = step.step_time_s, step.peak_memory_bytes, step.mfu
        else:
            numerics = job.whole.numerics()
            if numerics not in peaks:
                peaks[numerics] = mfu_peak(topology.gpu, model, numerics)
            mfu = flops / seconds / (peaks[numerics] * topology.num_gpus)
        ranked.append(Ranked(job.parallel, job.checkpointing, seconds, simulated, peak, mfu,
                             tight))
    ranked.sort(key=lambda r: r.step_time_s)
    return SearchResult(tuple(ranked), tuple(rejected), len(options),
                        time.perf_counter() - start, dominated, chosen)


