"""Where a communication group sits in a cluster, and which links it crosses.

A job of ``num_gpus`` GPUs fills nodes of one system design in order: global rank ``r`` lives
on node ``r // gpus_per_node``. A communication group is a set of ranks a fixed stride apart,
as the rank layouts of Megatron-LM and its kin produce them. With tensor parallelism innermost,
a tensor-parallel group is ``size`` consecutive ranks (stride 1) and stays inside a node when it
fits; a data-parallel group takes every ``tensor``-th rank and so spans nodes once the job does.

Placing a group answers what the collective cost model needs: how many of its ranks share a
node, how many nodes it spans, and the bandwidth and latency of the link inside the node and
between nodes, per GPU and per direction. Only nominal figures live here (line rates from the
link profiles); protocol efficiencies belong to ``gpusim.comm.collectives.CollectiveTuning``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from gpusim.errors import InvalidConfig
from gpusim.hardware.catalog import catalog, load_gpu, load_link, load_system
from gpusim.hardware.profile import GPUProfile, LinkProfile, SystemProfile

LinkFamily = Literal["pcie", "nvlink", "infinity-fabric", "infiniband", "ethernet"]

# NVLink SHARP (in-switch reduction) arrived with third-generation NVSwitch, which pairs with
# fourth-generation NVLink (Hopper); earlier NVSwitches only forward.
NVLS_MIN_NVLINK_GENERATION = 4

# Topologies where each GPU's links go to fixed peers, so a group using only some of the
# node's GPUs reaches them over only some of its links.
_MESHES = frozenset({"hybrid-cube-mesh", "full-mesh"})


@dataclass(frozen=True)
class CommGroup:
    """What one communication group crosses: sizes, and nominal per-GPU link figures.

    Bandwidths are bytes/s per GPU per direction at line rate; latencies are seconds per hop.
    ``inter_node_*`` describe the network even for a group inside one node (what it would
    cross); they are 0 and None on systems without one. ``nvls`` says whether the switch can
    reduce (NVLink SHARP) for this group.
    """

    size: int
    ranks_per_node: int
    num_nodes: int
    intra_node_bytes_per_s: float
    intra_node_latency_s: float
    intra_node_family: LinkFamily
    inter_node_bytes_per_s: float
    inter_node_latency_s: float
    inter_node_family: LinkFamily | None
    nvls: bool
    nvlink_generation: int | None

    def __post_init__(self) -> None:
        if min(self.size, self.ranks_per_node, self.num_nodes) < 1:
            raise InvalidConfig(
                f"a group needs at least one rank and node (got size {self.size}, "
                f"{self.ranks_per_node} per node, {self.num_nodes} nodes)"
            )
        if self.ranks_per_node * self.num_nodes < self.size:
            raise InvalidConfig(
                f"{self.size} ranks do not fit {self.num_nodes} nodes of {self.ranks_per_node}"
            )
        if self.intra_node_bytes_per_s <= 0 or (
            self.num_nodes > 1 and self.inter_node_bytes_per_s <= 0
        ):
            raise InvalidConfig(
                f"a group of {self.size} ranks on {self.num_nodes} node(s) needs positive "
                f"bandwidth on the links it crosses"
            )

    @property
    def spans_nodes(self) -> bool:
        return self.num_nodes > 1


@dataclass(frozen=True)
class Topology:
    """A job of ``num_gpus`` GPUs on nodes of one ``system`` design, with its links resolved."""

    system: SystemProfile
    gpu: GPUProfile
    num_gpus: int
    intra_node_link: LinkProfile
    host_link: LinkProfile
    inter_node_link: LinkProfile | None

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise InvalidConfig(f"a job needs at least one GPU (got {self.num_gpus})")
        if self.num_nodes > 1 and self.inter_node_link is None:
            raise InvalidConfig(
                f"{self.num_gpus} GPUs need {self.num_nodes} nodes of {self.system.name} "
                f"({self.gpus_per_node} GPUs each), but {self.system.name} has no inter-node "
                f"link (inter_node_link and nics_per_node); use at most {self.gpus_per_node} "
                f"GPUs or a system with a network"
            )

    @classmethod
    def build(cls, system: SystemProfile | str, num_gpus: int,
              gpu: GPUProfile | None = None) -> Topology:
        """Resolve the system's GPU (unless given) and links from the catalog."""
        profile = load_system(system) if isinstance(system, str) else system
        has_network = profile.inter_node_link is not None and profile.nics_per_node > 0
        return cls(
            system=profile,
            gpu=gpu or load_gpu(profile.gpu),
            num_gpus=num_gpus,
            intra_node_link=load_link(profile.intra_node_link),
            host_link=load_link(profile.host_link),
            inter_node_link=load_link(profile.inter_node_link)
            if has_network and profile.inter_node_link is not None
            else None,
        )

    @property
    def gpus_per_node(self) -> int:
        return self.system.gpus_per_node

    @property
    def num_nodes(self) -> int:
        return math.ceil(self.num_gpus / self.gpus_per_node)

    @property
    def nvls_capable(self) -> bool:
        """NVLink SHARP: an NVSwitch node of NVLink 4+ links and GPUs (Hopper onwards)."""
        link_generation = _generation(self.intra_node_link)
        gpu_generation = self.gpu.nvlink_generation or 0
        return (
            self.system.intra_node_topology == "nvswitch"
            and self.intra_node_link.family == "nvlink"
            and min(link_generation, gpu_generation) >= NVLS_MIN_NVLINK_GENERATION
        )

    @property
    def peers_share_links(self) -> bool:
        """Whether a GPU reaches all its node's peers through the same links (an NVSwitch's
        ports, a PCIe lane), so two of its groups communicating at once share them; in a
        mesh each peer has links of its own."""
        return self.system.intra_node_topology not in _MESHES

    def intra_node_bytes_per_s(self, ranks_per_node: int) -> float:
        """Per-GPU, per-direction bandwidth to the other ``ranks_per_node - 1`` group members.

        Through an NVSwitch every GPU reaches every other at its full link count. In a mesh
        (DGX-1 cube-mesh, MI300X full mesh) a GPU's links go to fixed peers, so a group of k of
        the node's g GPUs can use about (k-1)/(g-1) of them (exact for a full mesh). On a
        PCIe-switch system each GPU has its one x16 link, which its peer and its network
        traffic share.
        """
        links = self.system.intra_node_links_per_gpu
        per_gpu = links * self.intra_node_link.bandwidth
        if self.intra_node_link.family != "pcie" and self.gpu.nvlink_bandwidth_gb_s:
            # A GPU uses no more than its own NVLink (or Infinity Fabric) ports give, both
            # directions halved, nor more than the system wires to it; for every shipped
            # system the two agree, and a what-if value of the GPU's field takes effect.
            per_gpu = min(per_gpu, self.gpu.nvlink_bandwidth_gb_s * 1e9 / 2)
        if self.system.intra_node_topology in _MESHES and 1 < ranks_per_node < self.gpus_per_node:
            per_gpu *= (ranks_per_node - 1) / (self.gpus_per_node - 1)
        return per_gpu

    @property
    def inter_node_bytes_per_s(self) -> float:
        """Per-GPU, per-direction network bandwidth: the node's NICs shared by its GPUs.

        Capped at the host link, since the NIC reaches GPU memory over PCIe (GPUDirect RDMA).
        """
        if self.inter_node_link is None:
            return 0.0
        share = self.system.nics_per_node * self.inter_node_link.bandwidth / self.gpus_per_node
        return min(share, self.host_link.bandwidth)

    def place(self, size: int, *, stride: int = 1) -> CommGroup:
        """Place a group of ``size`` ranks ``stride`` apart, starting at rank 0.

        Stride 1 packs the group into as few nodes as possible (tensor parallelism); a stride
        of the tensor-parallel size gives the data-parallel group. The group at rank 0 stands
        for all groups of its kind, which is exact when ``stride`` divides the GPUs per node
        or is a multiple of it.
        """
        if size < 1 or stride < 1:
            raise InvalidConfig(
                f"a communication group needs size >= 1 and stride >= 1 "
                f"(got size {size}, stride {stride})"
            )
        span = (size - 1) * stride + 1
        if span > self.num_gpus:
            raise InvalidConfig(
                f"a group of {size} ranks {stride} apart spans {span} ranks, more than the "
                f"job's {self.num_gpus} GPUs"
            )
        per_node = Counter((i * stride) // self.gpus_per_node for i in range(size))
        ranks_per_node = max(per_node.values())
        inter = self.inter_node_link
        return CommGroup(
            size=size,
            ranks_per_node=ranks_per_node,
            num_nodes=len(per_node),
            intra_node_bytes_per_s=self.intra_node_bytes_per_s(ranks_per_node),
            intra_node_latency_s=self.intra_node_link.latency,
            intra_node_family=self.intra_node_link.family,
            inter_node_bytes_per_s=self.inter_node_bytes_per_s,
            inter_node_latency_s=inter.latency if inter is not None else 0.0,
            inter_node_family=inter.family if inter is not None else None,
            nvls=self.nvls_capable and ranks_per_node > 1,
            nvlink_generation=self.gpu.nvlink_generation,
        )

    def parallel_groups(
        self, *, tensor: int = 1, data: int = 1, pipeline: int = 1
    ) -> dict[str, CommGroup]:
        """The three groups of a tensor x data x pipeline layout (tensor innermost).

        Rank order is tensor, then data, then pipeline (Megatron-LM's default order without
        context or expert parallelism), so tensor groups fill nodes first, data groups span
        them, and pipeline neighbours are ``tensor x data`` ranks apart.
        """
        if tensor * data * pipeline != self.num_gpus:
            raise InvalidConfig(
                f"tensor {tensor} x data {data} x pipeline {pipeline} = "
                f"{tensor * data * pipeline} ranks, but the job has {self.num_gpus} GPUs"
            )
        return {
            "tensor": self.place(tensor, stride=1),
            "data": self.place(data, stride=tensor),
            "pipeline": self.place(pipeline, stride=tensor * data),
        }


def _generation(link: LinkProfile) -> int:
    """A link's generation as a number (0 when the profile names it otherwise, e.g. 100GbE)."""
    return int(link.generation) if link.generation.isdigit() else 0


def system_for_gpu(gpu: GPUProfile) -> tuple[SystemProfile, bool]:
    """A node design for ``gpu``: a catalog system built around it, else an assumed PCIe
    server (eight GPUs behind PCIe switches, one 100 GbE NIC, like server-8x-rtx4090).
    The flag says whether the design was assumed."""
    for system in catalog().all(SystemProfile):
        if system.gpu == gpu.name and system.gpus_per_node > 1:
            return system, False
    pcie = f"pcie{min(max(gpu.pcie_gen, 3), 5)}"
    assumed = SystemProfile(
        name=f"{gpu.name}-pcie-server",
        full_name=f"8x {gpu.full_name} PCIe server (assumed)",
        gpu=gpu.name, gpus_per_node=8, host_link=pcie, intra_node_link=pcie,
        intra_node_topology="pcie-switch", inter_node_link="ethernet-100g", nics_per_node=1,
        sources={"gpus_per_node": "assumed: no system profile names this GPU",
                 "cpus_per_node": "not modelled",
                 "intra_node_links_per_gpu": "one PCIe x16 link per GPU",
                 "nics_per_node": "assumed: one 100 GbE NIC per node"},
    )
    return assumed, True
