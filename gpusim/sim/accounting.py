"""Where a simulated unit's step went: a pass's time and its parts on a unit, and the
breakdown of the unit that finishes last.

Every term is a sum over the unit's passes in the order it ran them, so a run that
accumulates them elsewhere (locals of the stage's loop) gives the same figures to the bit.
"""

from __future__ import annotations

from typing import NamedTuple

from gpusim.plan.pass_cost import Work

BREAKDOWN_KEYS = ("forward", "backward", "recompute", "tensor_parallel_comm",
                  "context_parallel_comm", "expert_parallel_comm",
                  "pipeline_bubble", "pipeline_comm", "data_parallel_comm", "comm_slowdown",
                  "host_dispatch", "optimizer")


class PassCosts(NamedTuple):
    """A pass's time on a unit (before link sharing and compute slowdown) and its parts."""

    length: float
    tp: float  # tensor-parallel communication
    cp: float  # context-parallel
    ep: float  # expert-parallel
    host_wait: float  # the GPU waiting for the host
    recompute: float
    host_s: float  # dispatching it
    ep_hidden: float = 0.0  # compute beside expert-parallel all-to-alls (--ep-overlap)


def pass_costs(work: Work, compute: float, link: float) -> PassCosts:
    """A pass's time on a unit whose kernels take ``compute`` times and whose transfers
    ``link`` times as long as the plan's, and its parts."""
    busy = (work.compute_s * compute
            + (work.tp_comm_s + work.cp_comm_s + work.ep_comm_s) * link)
    length = max(busy + work.stall_s, work.host_s - work.host_lead_s)
    cp = work.cp_comm_s * link
    ep = work.ep_comm_s * link
    # The GPU waiting for the host (queue run dry, or a host-bound pass throughout).
    host_wait = max(0.0, length - work.compute_s * compute - work.tp_comm_s * link - cp - ep)
    return PassCosts(length, work.tp_comm_s * link, cp, ep, host_wait,
                     work.recompute_s * compute, work.host_s,
                     min(work.ep_hidden_s * link, work.compute_s * compute))


def breakdown(acct: dict[str, float], comm_slowdown: float) -> dict[str, float]:
    """The breakdown of a unit's step from its terms (comm_slowdown only when modelled)."""
    return {key: acct.get(key, 0.0) for key in BREAKDOWN_KEYS
            if comm_slowdown or key != "comm_slowdown"}


def input_bound(breakdown_s: dict[str, float], step_s: float, microbatches: int,
                input_interval_s: float) -> float:
    """The step no shorter than the loaders need to deliver its microbatches; the wait is
    added to ``breakdown_s`` as input_pipeline. Loader workers run on through every step,
    so in steady state a replica takes at least that long."""
    loaded = microbatches * input_interval_s
    breakdown_s["input_pipeline"] = max(0.0, loaded - step_s)
    return max(step_s, loaded)
