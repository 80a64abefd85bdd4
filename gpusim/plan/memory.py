"""The memory plan: what a job keeps on the device at its peak, and whether it fits.

Peak allocated memory (what ``torch.cuda.max_memory_allocated`` reports) is the sum of
weights, gradients, optimizer states, autocast's weight copies, the activations kept for
backward, and the largest transient buffer of any one layer. The device must also hold the
framework's own reservation (CUDA context, library workspaces, allocator slack), which
``max_memory_allocated`` does not see.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpusim import units
from gpusim.errors import OutOfMemory
from gpusim.plan.autocast import layer_precisions
from gpusim.plan.job import TrainingJob
from gpusim.workload.attention import Attention
from gpusim.workload.layers import Layer

# CUDA context, cuDNN handles and the allocator's own reservation (beyond the cuBLAS
# workspaces, below): commonly 0.5-1 GiB on current GPUs.
FRAMEWORK_RESERVED_BYTES = units.gib(0.75)
# The caching allocator rarely packs perfectly; leave this fraction of the card free.
ALLOCATOR_SLACK = 0.05

OPTIMIZER_STATE_BYTES = {"adam": 8, "adamw": 8, "sgd-momentum": 4, "sgd": 0}

# cuBLAS workspaces PyTorch takes from its caching allocator, so max_memory_allocated counts
# them: one for cuBLAS and one for cuBLASLt, each of the size the cuBLAS documentation
# recommends (cublasSetWorkspace: 32 MiB on Hopper and later, 4 MiB before). Measured: the
# smallest models of the models suite peak 62-67 MiB above their tensors on an H100 and an
# H200 (measurements/h100-sxm, h200; PyTorch 2.11, CUDA 13).
CUBLAS_WORKSPACES = 2
LARGE_WORKSPACE_ARCHITECTURES = frozenset({"hopper", "blackwell"})


def library_workspace_bytes(job: TrainingJob) -> float:
    device = job.device
    if not device.is_gpu or device.vendor != "nvidia":
        return 0.0
    size = 32 if device.architecture in LARGE_WORKSPACE_ARCHITECTURES else 4
    return CUBLAS_WORKSPACES * size * 2.0**20


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per category at the step's peak; ``peak_bytes`` is their sum."""

    weights: float
    gradients: float
    optimizer_states: float
    weight_copies: float
    activations: float
    transient: float
    framework_reserved: float
    capacity: float
    library_workspaces: float = 0.0

    @property
    def peak_bytes(self) -> float:
        """Peak allocated bytes, comparable with torch.cuda.max_memory_allocated."""
        return (self.weights + self.gradients + self.optimizer_states + self.weight_copies
                + self.activations + self.transient + self.library_workspaces)

    @property
    def required_bytes(self) -> float:
        return self.peak_bytes + self.framework_reserved

    @property
    def usable_bytes(self) -> float:
        return self.capacity * (1 - ALLOCATOR_SLACK)

    @property
    def fits(self) -> bool:
        return self.required_bytes <= self.usable_bytes

    def breakdown(self) -> dict[str, float]:
        return {
            "weights": self.weights,
            "gradients": self.gradients,
            "optimizer_states": self.optimizer_states,
            "weight_copies": self.weight_copies,
            "activations": self.activations,
            "transient": self.transient,
            "library_workspaces": self.library_workspaces,
            "framework_reserved": self.framework_reserved,
        }


def activation_bytes(job: TrainingJob) -> float:
    """Activations kept for backward by one microbatch, under the job's checkpointing."""
    kept, working = activation_split(job)
    return kept + working


def activation_split(job: TrainingJob) -> tuple[float, float]:
    """(bytes a microbatch keeps from its forward until its backward, bytes re-created
    for one block at a time during backward under full checkpointing)."""
    layers = job.model.layers
    precision = layer_precisions(job)

    def saved(lay: Layer) -> float:
        return lay.saved_bytes(n, precision[lay.name].numerics)

    n = job.microbatch_size
    first = next((i for i, lay in enumerate(layers) if job.trains_weights(lay)), len(layers))
    kept = layers[0 if job.input_requires_grad else first:]  # frozen prefix: no autograd
    if job.checkpointing == "none":
        return sum(saved(lay) for lay in kept), 0.0
    if job.checkpointing == "selective":
        # Attention cores keep only their inputs and outputs; scores and softmax statistics
        # are re-created in backward.
        return sum(lay.io_bytes(n, precision[lay.name].numerics) if isinstance(lay, Attention)
                   else saved(lay) for lay in kept), 0.0
    # Full checkpointing keeps each body block's input and re-creates one block at a time;
    # the layers around the body (embeddings, head, loss) keep what they save.
    checkpointed = job.model.checkpointed_blocks
    per_block: dict[str, float] = {}
    total = 0.0
    previous_out = 0
    for lay in kept:
        if lay.block not in checkpointed:
            total += saved(lay)
        else:
            if lay.block not in per_block:
                per_block[lay.block] = 0.0
                total += n * previous_out * precision[lay.name].numerics.act_bytes
            per_block[lay.block] += saved(lay)
        previous_out = lay.out_elements
    return total, max(per_block.values(), default=0.0)


def memory_plan(job: TrainingJob) -> MemoryPlan:
    """The peak memory of ``job`` by category (raises nothing; see ``check_fits``)."""
    layers = job.model.layers
    num = job.numerics()
    n = job.microbatch_size
    params = job.model.parameters
    trainable = sum(lay.params for lay in layers if job.is_trainable(lay.name))
    autocast = job.mixed_precision and job.device.is_gpu and not job.master_weights
    copies = params * num.act_bytes if autocast else 0.0
    master = 4.0 * trainable if job.master_weights and job.mixed_precision else 0.0
    # The largest layer output and its gradient alive together during backward.
    transient = max((2 * n * lay.out_elements * num.act_bytes for lay in layers), default=0)
    reserved = FRAMEWORK_RESERVED_BYTES if job.device.is_gpu else 0.0
    return MemoryPlan(
        weights=float(job.weight_bytes * params),
        gradients=float(job.grad_bytes * trainable),
        optimizer_states=OPTIMIZER_STATE_BYTES[job.optimizer] * trainable + master,
        weight_copies=copies,
        activations=activation_bytes(job),
        transient=float(transient),
        framework_reserved=reserved,
        capacity=job.device.memory_bytes,
        library_workspaces=library_workspace_bytes(job),
    )


def check_fits(job: TrainingJob, plan: MemoryPlan) -> None:
    """Raise OutOfMemory with the breakdown and what to try when ``plan`` does not fit."""
    if plan.fits:
        return
    parts = ", ".join(f"{k.replace('_', ' ')} {units.human_bytes(v)}"
                      for k, v in plan.breakdown().items() if v)
    advice = []
    if job.microbatch_size > 1:
        advice.append(f"a smaller batch or --grad-accum {2 * job.grad_accum}")
    if job.checkpointing == "none":
        advice.append("--checkpointing full")
    if job.precision in ("fp32", "tf32"):
        advice.append("--precision bf16 or fp16")
    advice.append("a GPU with more memory")
    raise OutOfMemory(
        f"{job.model.name} with microbatch {job.microbatch_size} needs "
        f"{units.human_bytes(plan.required_bytes)} but {job.device.name} has "
        f"{units.human_bytes(plan.usable_bytes)} usable ({parts}); try {', '.join(advice)}",
        required_bytes=plan.required_bytes,
        available_bytes=plan.usable_bytes,
        peak_bytes=plan.peak_bytes,
    )
