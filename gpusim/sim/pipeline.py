"""The discrete-event simulation of one parallel training step on SimPy.

One representative rank per pipeline stage (ranks of a stage behave alike whatever their
tensor or data position), or, per rank (``per_rank``), one unit per data-parallel replica and
stage, each standing for its tensor-parallel group (see ``gpusim.sim.ranks``); a
``Straggler`` makes one of them slow. Each has a compute stream, which runs the stage's forward and
backward passes in the order its schedule gives, and a data-parallel communication stream.
Pipeline neighbours exchange activations (forward) and their gradients (backward) over the
pipeline group's link; one transfer at a time crosses each link in each direction, and a
pass starts when its input has arrived. Tensor-parallel collectives are inside each pass.

Data parallelism, by ZeRO stage:
- 0 and 1: gradients are reduced once per step. With ``overlap_grad_reduce`` in buckets while
  the last backward pass of each chunk runs (PyTorch DDP), otherwise after it (one buffer).
  ZeRO-1 reduce-scatters instead of all-reducing and all-gathers the updated weights after
  its 1/DP share of the optimizer step.
- 2: every backward pass reduce-scatters its gradients in buckets as it runs.
- 3 (FSDP): every pass all-gathers its chunk's weights block by block, each block's
  gather prefetched while the previous block computes: the pass lasts at least as long as
  its gathers, and the step's first block waits for its own; gradients as in 2.

A collective starts when every rank of its group has reached it (data-parallel replicas of
a stage; the first and last stage for tied embeddings), and runs at the pace of its slowest
link. Pipeline transfers and data-parallel collectives that both cross the network share each
GPU's NIC while they overlap (``gpusim.sim.shared_link``). Inside a node whose GPUs reach each
other through shared ports (NVSwitch, PCIe), a pass's tensor-parallel traffic and a
data-parallel collective that stays in the node share the GPU's links; the pass's traffic is
taken as one transfer after its kernels. The step ends when every stage has finished its
optimizer step, and, with data-loader workers, no sooner than they can deliver its
microbatches (steady state: they run on through every step).
Every duration comes from the plan; the engine only schedules.

Modules: ``stage`` (the compute stream's loop), ``transfers`` (pipeline links),
``collectives`` (data-parallel streams and their gates), ``shared_link`` (links that
concurrent transfers share), ``unit`` (one simulated unit's state), ``accounting`` (where
the step went), ``clock`` (SimPy's environment with its queue kept by instant, and the
streams' driver) and ``calls`` (cheap events on it).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import simpy

from gpusim.cost.kernels import copy_cost
from gpusim.errors import InvalidConfig, SimulationStalled
from gpusim.hardware.catalog import host_link
from gpusim.plan.parallel import ParallelPlan, tied_embedding_params
from gpusim.sim.accounting import BREAKDOWN_KEYS, breakdown, input_bound
from gpusim.sim.calls import Gates
from gpusim.sim.clock import Clock, Stream
from gpusim.sim.collectives import DataParallel
from gpusim.sim.ranks import Straggler, rank_coords
from gpusim.sim.shared_link import SharedLink
from gpusim.sim.stage import Shared, StageTable, run_stage
from gpusim.sim.trace import Trace, TraceEvent
from gpusim.sim.transfers import Outputs, send_names, sender
from gpusim.sim.unit import Unit

__all__ = ["BREAKDOWN_KEYS", "COMM_SLOWDOWN", "PipelineResult", "simulate_pipeline"]


@dataclass(frozen=True)
class PipelineResult:
    step_time_s: float
    breakdown_s: dict[str, float]  # of the unit that finishes last; sums to step_time_s
    busy_fraction: float  # mean over simulated units of compute-stream busy time / step time
    critical_stage: int
    passes: int
    trace: Trace
    units: int = 1  # simulated units: stages, or replicas x stages per rank
    critical_replica: int = 0


# How much slower kernels run while a collective shares the GPU with them (NCCL's kernels
# take SMs and memory bandwidth): 18.9%, the average computational slowdown measured over
# GPT and Llama training kernels overlapped with their communication on 4 A100s, H100s,
# MI250s and MI210s (Agrawal et al., "Characterizing Compute-Communication Overlap in
# GPU-Accelerated Distributed Deep Learning", arXiv 2507.03114, abstract; maximum 40%).
COMM_SLOWDOWN = 0.189


def simulate_pipeline(plan: ParallelPlan, *, trace: bool = True, per_rank: bool = False,
                      straggler: Straggler | None = None,
                      comm_slowdown: float | None = None) -> PipelineResult:
    """Simulate one step of ``plan`` from an empty pipeline to the last optimizer step.

    ``per_rank`` simulates every data-parallel replica rather than one; a ``straggler``
    implies it. ``comm_slowdown``: the fraction by which kernels slow down while a
    data-parallel collective runs beside them on the same GPU (NCCL's kernels take SMs and
    memory bandwidth); None: COMM_SLOWDOWN, 0 leaves compute alone.

    Only the compute streams are processes (generators the clock resumes). Transfers and
    collectives are chains of callbacks on the clock (one per transfer while nothing else
    shares its link), so a step costs a few events per pass, and the same events, in the
    same order, per rank: work grows with the passes."""
    if comm_slowdown is None:
        comm_slowdown = COMM_SLOWDOWN
    if not 0.0 <= comm_slowdown < 1.0:
        raise InvalidConfig(f"the compute slowdown during communication is a fraction in "
                            f"[0, 1) (got {comm_slowdown})")
    job = plan.job
    par = job.parallel
    pp, micro = par.pipeline, plan.microbatches
    replicas = par.data if per_rank or straggler is not None else 1
    env = Clock()
    events: list[TraceEvent] | None = [] if trace else None
    slow = {}
    if straggler is not None:
        at = rank_coords(straggler.rank, par.tensor, par.data, pp)
        slow[(at.replica, at.stage)] = (straggler.compute, straggler.link)
    # Made stage by stage: a stage's replicas act at the same instants one after another,
    # and their objects side by side in memory keep that sweep within fewer pages. Listed
    # (and started) replica by replica, the order of the simulated events.
    by_stage = [Unit(r, s, replicas, *slow.get((r, s), (1.0, 1.0)))
                for s in range(pp) for r in range(replicas)]
    units = [by_stage[s * replicas + r] for r in range(replicas) for s in range(pp)]
    # When pipeline transfers and data-parallel collectives both leave the node, they share
    # the GPU's NIC (each GPU of a DGX-style node has its own): overlapping ones slow each
    # other. Transfers load the sender's NIC; collectives every member's.
    shared = (pp > 1 and par.data > 1 and plan.groups["pipeline"].spans_nodes
              and plan.groups["data"].spans_nodes)
    # Inside a node, a GPU's tensor-parallel collectives and its data-parallel ones (when
    # the data-parallel group stays in the node) leave through the same links; those that
    # overlap, buckets reduced or ZeRO-3 weights gathered during a pass, share them.
    dp_during_passes = par.overlap_grad_reduce or par.zero >= 2
    on_node_links = (par.tensor > 1 and par.data > 1 and dp_during_passes
                     and not plan.groups["data"].spans_nodes
                     and job.topology.peers_share_links)
    for unit in by_stage:
        unit.nic = SharedLink(env) if shared else None
        unit.node_links = SharedLink(env) if on_node_links else None
    link = [[units[r * pp + s].link for s in range(pp)] for r in range(replicas)]
    seconds_of: dict[tuple[str, str, float], float] = {}

    def collective_s(collective: str, group: str, n_bytes: float) -> float:
        """The plan's time for a collective; buckets of a chunk all ask the same."""
        key = (collective, group, n_bytes)
        if key not in seconds_of:
            seconds_of[key] = plan.collective_s(collective, group, n_bytes)  # type: ignore[arg-type]
        return seconds_of[key]

    pcie = host_link(job.topology.gpu)

    def host_copy_s(n_bytes: float) -> float:
        return copy_cost(n_bytes, pcie.bandwidth, pcie.latency, plan.calibration.pcie_efficiency)

    # A collective of a stage's replicas runs at the pace of its slowest member's link.
    group_link = [max(link[q][s] for q in range(replicas)) for s in range(pp)]
    grad_bytes = job.whole.reduce_bytes  # as the gradients travel
    dp = DataParallel(env, par, replicas, collective_s, group_link, grad_bytes, comm_slowdown,
                      shared or on_node_links, events)
    outputs = [Outputs(env) for _ in range(replicas)]
    sh = Shared(env, par, dp, outputs, Gates(), comm_slowdown, events, grad_bytes,
                job.whole.weight_bytes, job.gathered_weight_bytes, tied_embedding_params(job),
                host_copy_s if job.offload == "params" else None,
                lambda r: max(link[r][0], link[r][pp - 1]))
    tables = [StageTable(par, s, plan.stages[s], micro, trace) for s in range(pp)]
    names = send_names(micro, pp * par.virtual_stages) if trace else []
    p2p_s = plan.p2p_s
    hop_lists: dict[tuple[float, ...], list[float]] = {}  # alike units share one
    streams = {}
    for unit in by_stage:
        r, s = unit.replica, unit.stage
        unit.costs = tables[s].costs(unit.compute, unit.link)

        def hop_s(source: int, target: int, r: int = r) -> float:
            return p2p_s * max(link[r][source], link[r][target])

        hops = [hop_s(source, s) if source != s else 0.0 for source in range(pp)]
        hops = hop_lists.setdefault(tuple(hops), hops)
        forward, backward = (
            sender(env, outputs[r], None if target == s or p2p_s == 0.0 else hop_s(s, target),
                   unit.nic, events, unit.tracks[1], names)
            for target in ((s + 1) % pp, (s - 1) % pp))
        unit.senders = (forward, backward)
        streams[unit] = run_stage(sh, unit, tables[s], hops)
    procs = [Stream(env, streams[unit]) for unit in units]
    # The run allocates hundreds of thousands of short-lived events and callbacks, and
    # Python's cyclic collector would walk everything alive each time their count builds
    # up; paused, their cycles are freed once after it.
    collecting = gc.isenabled()
    gc.disable()
    try:
        env.run(until=simpy.AllOf(env, procs))
    except RuntimeError as exc:  # SimPy ran out of events with a rank still waiting
        stuck = sorted(f"stage {u.stage} replica {u.replica}" for u in units if not u.end)
        raise SimulationStalled(
            f"the simulated step stalled at {env.now:.6g} s with {', '.join(stuck[:4])}"
            f"{' and more' if len(stuck) > 4 else ''} waiting on collectives the others "
            f"never reached; this is a simulator defect, please report the command") from exc
    finally:
        if collecting:
            gc.enable()
    step = max(u.end for u in units)
    critical = max(units, key=lambda u: (u.end, -u.stage, -u.replica))
    breakdown_s = breakdown(critical.acct, comm_slowdown)
    if job.input_interval_s:
        step = input_bound(breakdown_s, step, micro, job.input_interval_s)
    busy = sum(u.busy for u in units) / (len(units) * step) if step else 0.0
    passes = replicas * sum(len(table.rows) for table in tables)
    return PipelineResult(step, breakdown_s, busy, critical.stage, passes,
                          Trace(tuple(events or ())), len(units), critical.replica)
