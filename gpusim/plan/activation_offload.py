"""Activation offloading: the tensors a microbatch saves for backward wait in host memory.

As torchtune does it (torchtune/training/_activation_offloading.py, OffloadActivations, a
``saved_tensors_hooks`` context around the model's forward):

- In forward, each saved tensor of at least ``min_offload_size`` bytes (1024 by default)
  is copied to pinned host memory on a side stream; the GPU copy is kept alive only until
  its copy is done (a short forward stash, ``max_fwd_stash_size``). Smaller tensors stay.
- In backward, each node's tensors come back on the side stream when autograd unpacks them,
  and are freed once the next node runs.
- The output head is left out (get_act_offloading_ctx_manager wraps ``model.output`` in a
  NoOpManager: it would be brought back at once), and the loss is computed outside the
  context (recipes/full_finetune_single_device.py, _loss_step), so both keep theirs.
- Under activation checkpointing, a checkpointed block's input is saved through the same
  hooks (torch/utils/checkpoint.py, _checkpoint_without_reentrant_generator saves the
  inputs with _NoopSaveInputs before entering its own hooks), so it is offloaded; what a
  block re-creates in backward runs under checkpoint's recomputation hooks and stays.

So the GPU keeps what is not offloaded and about two units' worth in flight (a unit: a
block's saved tensors, or under checkpointing its input; a layer outside any block on its
own). Every offloaded byte crosses the host link once down during forward and once up during
backward; the copies run beside compute, so only what a pass's transfer takes beyond the
pass itself is exposed. That is the best case: in backward torchtune starts each copy when
autograd asks for the tensor, which overlaps only as far as the host runs ahead of the GPU.
"""

from __future__ import annotations

from gpusim.cost.kernels import copy_cost
from gpusim.hardware.calibration import Calibration
from gpusim.hardware.catalog import host_link
from gpusim.hardware.profile import GPUProfile
from gpusim.plan.job import TrainingJob
from gpusim.workload.attention import CrossEntropy
from gpusim.workload.layers import Linear

# OffloadActivations' min_offload_size default: smaller tensors stay on the GPU.
MIN_OFFLOAD_BYTES = 1024
# Units whose saved tensors are on the GPU at once: the one being copied and the one in use.
IN_FLIGHT_UNITS = 2
# The breakdown entry for the transfer time compute does not cover.
BREAKDOWN_KEY = "activation_offload"


def _kept_on_gpu(job: TrainingJob) -> set[str]:
    """Layers whose saved tensors are never offloaded: the output head (the last product
    before the loss) and everything from it on (the loss)."""
    layers = job.model.layers
    loss = next((i for i, la in enumerate(layers) if isinstance(la, CrossEntropy)), None)
    if loss is None:
        return set()
    head = next((i for i in range(loss - 1, -1, -1) if isinstance(layers[i], Linear)), loss)
    return {la.name for la in layers[head:]}


def offload_split(job: TrainingJob, kept: dict[str, float]) -> tuple[float, float]:
    """(bytes of one microbatch's saved tensors that go to the host, bytes that stay on the
    GPU: what is not offloaded and the units in flight), from ``kept``, what each layer (or
    checkpointed block, as ``<block>.input``) saves for backward."""
    block_of = {la.name: la.block for la in job.model.layers}
    stays = _kept_on_gpu(job)
    resident = 0.0
    units: dict[str, float] = {}
    for name, value in kept.items():
        if name in stays or value < MIN_OFFLOAD_BYTES:
            resident += value
            continue
        unit = name.removesuffix(".input") if name not in block_of else block_of[name] or name
        units[unit] = units.get(unit, 0.0) + value
    offloaded = sum(units.values())
    largest = sorted(units.values(), reverse=True)[:IN_FLIGHT_UNITS]
    return offloaded, resident + sum(largest)


def transfer_seconds(job: TrainingJob, offloaded_bytes: float, cal: Calibration) -> float:
    """Seconds to move one microbatch's offloaded activations one way over the host link."""
    if not isinstance(job.device, GPUProfile) or not offloaded_bytes:
        return 0.0
    link = host_link(job.device)
    return copy_cost(offloaded_bytes, link.bandwidth, link.latency, cal.pcie_efficiency)


def exposed_seconds(job: TrainingJob, offloaded_bytes: float, breakdown_s: dict[str, float],
                    cal: Calibration) -> float:
    """Step seconds the transfers add: per pass, the part of its copies (down in forward, up
    in backward, every microbatch) that the pass's own compute does not cover."""
    one_way = job.grad_accum * transfer_seconds(job, offloaded_bytes, cal)
    forward = breakdown_s.get("forward", 0.0)
    backward = breakdown_s.get("backward", 0.0) + breakdown_s.get("recompute", 0.0)
    if job.optimizer_in_backward:  # the steps run inside the backward pass
        backward += breakdown_s.get("optimizer", 0.0)
    return max(0.0, one_way - forward) + max(0.0, one_way - backward)
