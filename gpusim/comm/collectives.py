"""Seconds for NCCL-style collectives over a placed group: an alpha-beta model.

An algorithm costs a fixed start-up latency, a latency per step (the link profiles' hop
latency times the steps it takes) and the bytes each GPU moves over its slowest link divided by
that link's effective bandwidth (line rate x efficiency). Like NCCL, every call takes the
fastest algorithm for its size: a tree for tiny messages (log-depth latency), a ring for large
ones (bandwidth-optimal), NVLink SHARP (NVLS) all-reduce where the switch reduces, and a
hierarchical schedule for groups that span nodes.

Sizes follow nccl-tests: ``n_bytes`` is one rank's full buffer: the reduced buffer of
all-reduce, the gathered output of all-gather, the input of reduce-scatter, the broadcast
buffer, each rank's whole send buffer for all-to-all, the message of a send/receive.

NCCL's protocols (LL, LL128, Simple) are not modelled apart: latencies are its low-latency
figures and bandwidths its large-message ones, right at both ends and optimistic in between.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import Literal, get_args

from gpusim.comm.topology import CommGroup, LinkFamily
from gpusim.errors import InvalidConfig

Collective = Literal[
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv"
]
Algorithm = Literal["ring", "tree", "nvls", "hierarchical", "direct"]
COLLECTIVES: tuple[Collective, ...] = get_args(Collective)


@dataclass(frozen=True)
class CollectiveTuning:
    """Stated constants of the collective model; defaults are sourced, not fitted.

    Latencies are seconds; efficiencies are the fraction of line rate that carries payload.
    """

    # NCCL's own tuning model (src/graph/tuning.cc, baseLat for the LL protocol): the fixed
    # cost of a ring or tree collective, kernel launch and proxy set-up included.
    ring_base_latency_s: float = 6.6e-6
    tree_base_latency_s: float = 6.8e-6
    # NVLS runs only NCCL's Simple protocol and sets up multicast memory: NCCL's tuning model
    # charges about 25 us (hwLat, NVLS on NVLink), so NVLS wins only from megabytes up.
    nvls_base_latency_s: float = 25e-6
    # Multipliers on the link profiles' hop latency, which already are NCCL's per-ring-step
    # figures; NCCL's tables give tree steps the same order (0.6 us LL on NVLink for both).
    ring_step_latency_factor: float = 1.0
    tree_step_latency_factor: float = 1.0
    # NVLink and Infinity Fabric: NCCL's topology model counts 20.0 (Ampere) and 20.6 (Hopper)
    # GB/s per 25 GB/s NVLink (topo.h), i.e. ~20% packet and protocol overhead, as its
    # maintainer states for H100 (nccl-tests #212: 370 of 450 GB/s).
    gpu_link_efficiency: float = 0.80
    # PCIe: TLP headers on 256-byte payloads leave ~88% (peer copies measure 54-56 of 63 GB/s
    # on Gen5 RTX PRO 6000 servers, voipmonitor/rtx6kpro), and NCCL's LL128 framing keeps 120
    # of 128 bytes: 0.88 x 0.92 ~ 0.8.
    pcie_efficiency: float = 0.80
    # InfiniBand / RoCE: profile rates are data rates already (after 64b/66b); RDMA headers at
    # 4 KiB MTU cost ~2% and NCCL's proxy pipelining a few more.
    network_efficiency: float = 0.90
    # NVLS: NCCL's tuning model (nvlsEfficiency): the switch's reductions sustain 85% of the
    # NVLink rate on Hopper (NVLink 4) and 74% on Blackwell (NVLink 5).
    nvls_efficiency_nvlink4: float = 0.85
    nvls_efficiency_nvlink5: float = 0.74

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if "efficiency" in field.name and not 0.0 < value <= 1.0:
                raise InvalidConfig(f"{field.name} must be in (0, 1] (got {value})")
            if value < 0.0:
                raise InvalidConfig(f"{field.name} must not be negative (got {value})")

    def link_efficiency(self, family: LinkFamily) -> float:
        """The payload fraction of a link family's line rate."""
        if family in ("nvlink", "infinity-fabric"):
            return self.gpu_link_efficiency
        if family == "pcie":
            return self.pcie_efficiency
        return self.network_efficiency

    def nvls_efficiency(self, nvlink_generation: int | None) -> float:
        """The NVLS factor for a GPU's NVLink generation (NVLink 5 onwards: Blackwell's)."""
        if (nvlink_generation or 0) >= 5:
            return self.nvls_efficiency_nvlink5
        return self.nvls_efficiency_nvlink4


DEFAULT_TUNING = CollectiveTuning()


@dataclass(frozen=True)
class _Links:
    """A group's effective figures: bytes/s per GPU per direction, and seconds per hop.

    ``flat_bytes_per_s`` is the slowest hop of a ring or tree laid across all ranks: every
    channel crosses each node boundary once, so the group's share of the node's NICs
    (inter-node per GPU x ranks per node) must carry what one GPU sends inside the node.
    """

    intra_bytes_per_s: float
    inter_bytes_per_s: float
    flat_bytes_per_s: float
    intra_step_s: float
    inter_step_s: float


def _links(group: CommGroup, tuning: CollectiveTuning) -> _Links:
    family = group.inter_node_family
    intra = group.intra_node_bytes_per_s * tuning.link_efficiency(group.intra_node_family)
    inter = group.inter_node_bytes_per_s * (tuning.link_efficiency(family) if family else 1.0)
    if not group.spans_nodes:
        flat = intra
    elif group.ranks_per_node == 1:
        flat = inter
    else:
        flat = min(intra, inter * group.ranks_per_node)
    return _Links(intra, inter, flat, group.intra_node_latency_s, group.inter_node_latency_s)


def _ring(group: CommGroup, volume_bytes: float, passes: int, tuning: CollectiveTuning) -> float:
    """``passes`` trips round a ring (or down a chain); each GPU sends ``volume_bytes``.

    A trip is n-1 hops, of which one per node boundary runs on the network.
    """
    links = _links(group, tuning)
    inter_steps = passes * (group.num_nodes - 1)
    intra_steps = passes * (group.size - 1) - inter_steps
    steps_s = intra_steps * links.intra_step_s + inter_steps * links.inter_step_s
    return (
        tuning.ring_base_latency_s
        + tuning.ring_step_latency_factor * steps_s
        + volume_bytes / links.flat_bytes_per_s
    )


def _tree(group: CommGroup, n_bytes: float, tuning: CollectiveTuning) -> float:
    """Double binary tree all-reduce: reduce up, broadcast down, ``n_bytes`` each way.

    Log-depth inside the node too, where NCCL chains the node's GPUs instead: the model's
    tree is a little faster than NCCL's for tiny messages inside one node.
    """
    links = _links(group, tuning)
    depth_s = (
        math.ceil(math.log2(group.ranks_per_node)) * links.intra_step_s
        + math.ceil(math.log2(group.num_nodes)) * links.inter_step_s
    )
    return (
        tuning.tree_base_latency_s
        + tuning.tree_step_latency_factor * 2 * depth_s
        + 2 * n_bytes / links.flat_bytes_per_s
    )


def _nvls(group: CommGroup, n_bytes: float, tuning: CollectiveTuning) -> float:
    """NVLink SHARP all-reduce: the switch reduces (multimem load-reduce) and multicasts.

    Each GPU serves reads of its whole buffer and receives the multicast result, and moves
    its own 1/n slice once more each way: (1 + 1/n) x bytes per direction against a ring's
    2(n-1)/n (0.64 of it at n = 8, half as n grows), at the NVLS efficiency on top of the
    link's.
    """
    links = _links(group, tuning)
    bandwidth = links.intra_bytes_per_s * tuning.nvls_efficiency(group.nvlink_generation)
    volume = (1 + 1 / group.size) * n_bytes
    return tuning.nvls_base_latency_s + 2 * links.intra_step_s + volume / bandwidth


def _hierarchical(group: CommGroup, n_bytes: float, passes: int, tuning: CollectiveTuning) -> float:
    """Inside each node a ring over its ranks, across nodes a ring over 1/r of the bytes.

    All-reduce (two passes): reduce-scatter inside the node, all-reduce across nodes on the
    slower link, all-gather inside the node, one after another. One pass is the reduce-scatter
    (or all-gather) half of that.
    """
    links = _links(group, tuning)
    r, nodes = group.ranks_per_node, group.num_nodes
    steps_s = passes * ((r - 1) * links.intra_step_s + (nodes - 1) * links.inter_step_s)
    intra_s = passes * (r - 1) / r * n_bytes / links.intra_bytes_per_s
    inter_s = passes * (nodes - 1) / nodes * (n_bytes / r) / links.inter_bytes_per_s
    latency_s = tuning.ring_base_latency_s + tuning.ring_step_latency_factor * steps_s
    return latency_s + intra_s + inter_s


def _all_to_all(group: CommGroup, n_bytes: float, tuning: CollectiveTuning) -> float:
    """Each rank sends 1/n of its buffer to every other; on- and off-node parts overlap."""
    links = _links(group, tuning)
    n, r = group.size, group.ranks_per_node
    seconds = (r - 1) / n * n_bytes / links.intra_bytes_per_s if r > 1 else 0.0
    step_s = links.intra_step_s
    if group.spans_nodes:
        seconds = max(seconds, (n - r) / n * n_bytes / links.inter_bytes_per_s)
        step_s = links.inter_step_s
    return tuning.ring_base_latency_s + step_s + seconds


def _send_recv(group: CommGroup, n_bytes: float, tuning: CollectiveTuning) -> float:
    """One message between two members: over the network when the group spans nodes."""
    links = _links(group, tuning)
    if group.spans_nodes:
        return tuning.ring_base_latency_s + links.inter_step_s + n_bytes / links.inter_bytes_per_s
    return tuning.ring_base_latency_s + links.intra_step_s + n_bytes / links.intra_bytes_per_s


def algorithm_seconds(
    collective: Collective,
    group: CommGroup,
    n_bytes: float,
    tuning: CollectiveTuning = DEFAULT_TUNING,
) -> dict[Algorithm, float]:
    """Seconds of every algorithm that can run ``collective`` on ``group``.

    An empty mapping means there is nothing to do (one rank, or no bytes).
    """
    if n_bytes < 0:
        raise InvalidConfig(f"a message cannot have negative size (got {n_bytes} bytes)")
    if collective not in COLLECTIVES:
        raise InvalidConfig(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if group.size == 1 or n_bytes == 0:
        return {}
    n = group.size
    hierarchical = group.spans_nodes and group.ranks_per_node > 1
    times: dict[Algorithm, float] = {}
    if collective == "all_reduce":
        times["ring"] = _ring(group, 2 * (n - 1) / n * n_bytes, 2, tuning)
        times["tree"] = _tree(group, n_bytes, tuning)
        if group.nvls and not group.spans_nodes:
            times["nvls"] = _nvls(group, n_bytes, tuning)
        if hierarchical:
            times["hierarchical"] = _hierarchical(group, n_bytes, 2, tuning)
    elif collective in ("all_gather", "reduce_scatter"):
        times["ring"] = _ring(group, (n - 1) / n * n_bytes, 1, tuning)
        if hierarchical:
            times["hierarchical"] = _hierarchical(group, n_bytes, 1, tuning)
    elif collective == "broadcast":
        # A pipelined chain: every rank receives the whole buffer once, n-1 hops deep.
        times["ring"] = _ring(group, n_bytes, 1, tuning)
    elif collective == "all_to_all":
        times["direct"] = _all_to_all(group, n_bytes, tuning)
    else:
        times["direct"] = _send_recv(group, n_bytes, tuning)
    return times


def fastest_algorithm(
    collective: Collective,
    group: CommGroup,
    n_bytes: float,
    tuning: CollectiveTuning = DEFAULT_TUNING,
) -> tuple[Algorithm | None, float]:
    """The algorithm NCCL-style selection would take, and its seconds (None, 0 when idle)."""
    times = algorithm_seconds(collective, group, n_bytes, tuning)
    if not times:
        return None, 0.0
    best = min(times, key=lambda a: times[a])
    return best, times[best]


@functools.lru_cache(maxsize=1 << 16)
def collective_seconds(
    collective: Collective,
    group: CommGroup,
    n_bytes: float,
    tuning: CollectiveTuning = DEFAULT_TUNING,
) -> float:
    """Seconds of ``collective`` on ``n_bytes`` over ``group``, fastest algorithm (kept for
    the next call with the same size and group: a search asks again and again)."""
    return fastest_algorithm(collective, group, n_bytes, tuning)[1]



# nccl-tests' busBw factors (doc/PERFORMANCE.md): the share of the buffer that must cross
# the busiest link, so busBw is comparable with link bandwidth whatever the rank count.
def _bus_factor(collective: Collective, n: int) -> float:
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def bus_bandwidth(collective: Collective, n: int, n_bytes: float, seconds: float) -> float:
    """nccl-tests' bus bandwidth in bytes/s: algBw (bytes / seconds) x the collective's factor.

    All-reduce x 2(n-1)/n; all-gather, reduce-scatter and all-to-all x (n-1)/n; broadcast and
    send/receive x 1. One rank moves nothing, so its bus bandwidth is 0.
    """
    if n < 1 or n_bytes < 0 or seconds < 0:
        raise InvalidConfig(
            f"bus bandwidth needs n >= 1, bytes >= 0 and seconds >= 0 "
            f"(got n {n}, {n_bytes} bytes, {seconds} s)"
        )
    if n == 1 or n_bytes == 0:
        return 0.0
    if seconds == 0:
        raise InvalidConfig(f"{n_bytes} bytes among {n} ranks cannot take zero seconds")
    return n_bytes / seconds * _bus_factor(collective, n)
