"""The device memory NCCL's (and RCCL's) communicators hold on each GPU.

NCCL allocates its channel buffers itself, outside PyTorch's caching allocator, so
``torch.cuda.max_memory_allocated`` never shows them, yet they take memory a job could
otherwise use. Every process group a rank communicates in is a communicator of its own
(NVIDIA/nccl #864, maintainer's answer: "More communicators = more memory used"), and it
holds:

* collective buffers: per channel, for each peer connection, a FIFO per protocol (SIMPLE
  4 MiB, LL128 4.6875 MiB, LL 512 KiB; src/init.cc and src/transport/p2p.cc at NCCL
  2.30.7). Taken at the one clean measurement of a whole communicator: on 4 A100s joined
  by NVLink, a PyTorch process group took 544 MB with 2 ranks and 688 MB with 3 or 4,
  after one all-reduce (NVIDIA/nccl #964);
* NVLink SHARP buffers, where the group's ranks in a node reach each other through an
  NVLS-capable NVSwitch and it has more than two (NCCL enables NVLS only then; vLLM #9699):
  ``channels x 2 x chunk x NCCL_STEPS`` bytes for each of the group's ranks in the node
  (src/transport/nvls.cc at NCCL 2.30.7: 16 channels on Hopper, 32 on Blackwell, 128 KiB
  chunks, 8 steps; 256 MiB for eight H100s);
* point-to-point buffers to every peer in its node it sends to or receives from (pipeline
  neighbours, the all-to-alls of expert parallelism): on eight H100s the first
  all_to_all_single added 3.28 GB to memory outside PyTorch's allocator (NVIDIA/nccl #1685,
  1.06 -> 4.34 GB), taken as an equal share for each of the 7 peers. Peers in other nodes
  share one buffer over the network instead ("for send/recv operations however, we have a
  single shared buffer", NVIDIA/nccl #1450): 512 MiB (NVIDIA/nccl #2363, "Failed to CUDA
  calloc 536870912 bytes" for the NET shared P2P buffer; PR #2366 saves that much).

Our own H100 (NCCL 2.28.9 under PyTorch 2.11, measurements/h100-sxm/probes.json, "nccl")
bears out that most of a communicator is not peer buffers: a process group of one rank took
564 MiB outside PyTorch's allocator when created (the process's first, with NCCL's own
set-up) and a second one 388 MiB, before and after collectives alike. A lone rank's group is
counted as nothing here; a framework that creates one eagerly (PyTorch does, for every new
group, once the default group is bound to a device) pays about that much for it.

The rows, their caveats and what was not found are in measurements/published/
nccl_memory.yaml; tests/test_nccl_memory.py reads the figures back from it. Not modelled:
the further groups a framework creates and uses beside its parallel layout (Megatron-LM's
model-parallel and embedding groups for gradient norms and tied weights), so a Megatron job
holds more than this (verl #6408 frees 7 GB a rank of a TP 2 x PP 2 x DP 2 job on eight
H100s); and NCCL versions before lazy connection (2.22), which connect every algorithm when
the communicator is made.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpusim.comm.topology import CommGroup

# One process group's collective buffers (NVIDIA/nccl #964: "for group with only 2 devices,
# it requires 544 MB. And for group with more than 2 devices, it requires 688 MB"; MB taken
# as 10^6 bytes, as printed).
PAIR_COMMUNICATOR_BYTES = 544e6
COMMUNICATOR_BYTES = 688e6
# Point-to-point buffers per peer (NVIDIA/nccl #1685: 1.06 GB before and 4.34 GB after the
# first all_to_all_single among eight H100s, so 3.28 GB over 7 peers).
PEER_BYTES = (4.34e9 - 1.06e9) / 7
# The buffer point-to-point traffic to other nodes shares (NVIDIA/nccl #2363, PR #2366).
NET_SHARED_BYTES = 512 * 2**20
# NVLink SHARP: NVLS_NCHANNELS per architecture (src/transport/nvls.cc: SM90 16, SM100 32),
# the default NCCL_NVLS_CHUNKSIZE (128 KiB) and NCCL_STEPS (8, src/include/device.h).
NVLS_CHANNELS = {"hopper": 16, "blackwell": 32}
NVLS_CHUNK_BYTES = 128 * 1024
NCCL_STEPS = 8

# The groups a rank runs collectives in (gpusim.plan.parallel's names). The data-parallel
# group's reductions run in the shard group: the same ranks unless sharding is hybrid, whose
# replicate group is then a communicator of its own.
COLLECTIVE_GROUPS = ("tensor", "shard", "replicate", "context", "expert", "embedding")


def collective_bytes(group: CommGroup, architecture: str) -> float:
    """One communicator's buffers for the collectives of ``group`` (0 for a lone rank)."""
    if group.size < 2:
        return 0.0
    held = PAIR_COMMUNICATOR_BYTES if group.size == 2 else COMMUNICATOR_BYTES
    if group.nvls and group.ranks_per_node > 2:
        channels = NVLS_CHANNELS.get(architecture, NVLS_CHANNELS["hopper"])
        held += channels * 2 * NVLS_CHUNK_BYTES * NCCL_STEPS * group.ranks_per_node
    return held


def peer_bytes(inside: int, beyond: int) -> float:
    """Point-to-point buffers for ``inside`` peers in the rank's node (one set each) and
    ``beyond`` peers in other nodes (one shared set for all of them)."""
    return inside * PEER_BYTES + (NET_SHARED_BYTES if beyond else 0.0)


def communicator_bytes(groups: Mapping[str, CommGroup], architecture: str) -> dict[str, float]:
    """Per group, the bytes its communicator holds on each of its ranks: collective buffers
    for every group of more than one rank, and point-to-point buffers for every other rank
    of an expert-parallel group (its all-to-alls) and for the pipeline's neighbours, as the
    rank holding the most sees them: one each side, one of them in another node where the
    stages span nodes."""
    held = {name: collective_bytes(groups[name], architecture)
            for name in COLLECTIVE_GROUPS if name in groups}
    expert = groups.get("expert")
    if expert is not None and expert.size > 1:
        inside = expert.ranks_per_node - 1
        held["expert"] += peer_bytes(inside, expert.size - 1 - inside)
    pipeline = groups.get("pipeline")
    if pipeline is not None and pipeline.size > 1:
        neighbours = min(2, pipeline.size - 1)
        beyond = 0 if not pipeline.spans_nodes else (
            neighbours if pipeline.ranks_per_node == 1 else 1)
        held["pipeline"] = peer_bytes(neighbours - beyond, beyond)
    return {name: b for name, b in held.items() if b > 0}
