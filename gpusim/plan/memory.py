"""The memory plan: what a job keeps on the device at its peak, and whether it fits.

Peak allocated memory (what ``torch.cuda.max_memory_allocated`` reports) is the sum of
weights, gradients, optimizer states, autocast's weight copies, the activations kept for
backward, and the largest transient buffer of any one layer. The device must also hold the
framework's own reservation (CUDA context, handles), NCCL's communicators on more than one
GPU (gpusim.comm.nccl_memory) and what the caching allocator strands in fragments, which
``max_memory_allocated`` does not see; it has what its driver gives a process, a little
less than its datasheet's capacity.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass

from gpusim import units
from gpusim.plan.activation_offload import offload_split
from gpusim.plan.autocast import LayerPrecision, casts_weight, layer_precisions
from gpusim.plan.job import TrainingJob
from gpusim.plan.recompute import (
    DENSE_MLP,
    MLA_UP_PROJ,
    checkpointed_blocks,
    policy_kept_bytes,
    recomputed_norm,
    rerun_with,
    selective_modules,
)
from gpusim.workload.attention import Attention, CrossEntropy
from gpusim.workload.layers import Conv2d, Elementwise, Layer, Linear
from gpusim.workload.moe import MoE
from gpusim.workload.numerics import Numerics
from gpusim.workload.ops import DTYPE_BYTES

# CUDA context, cuDNN handles and the allocator's own reservation (beyond the cuBLAS
# workspaces, below): commonly 0.5-1 GiB on current GPUs. Measured on an H100 (PyTorch 2.11,
# CUDA 13; measurements/h100-sxm/probes.json, "context"): outside the caching allocator a
# process held 527 MiB after creating its context, 685 MiB after its first cuBLAS product,
# 703 MiB after a cuDNN convolution and 767 MiB (0.749 GiB) after a fused AdamW step.
FRAMEWORK_RESERVED_BYTES = units.gib(0.75)
# What the caching allocator strands when memory runs short, as a fraction of the allocated
# peak: free space inside segments that still hold live tensors. Before it reports out of
# memory it frees every wholly free cached segment and retries (c10/cuda/
# CUDACachingAllocator.cpp, malloc: release_cached_blocks), so what an OOM message calls
# "reserved by PyTorch but unallocated" is what could not be given back. The median of that
# over "allocated by PyTorch" in 20 training runs' OOM messages (measurements/published/
# oom_fragmentation.yaml; quartiles 0.6% and 5.8%, a few runs strand far more);
# tests/test_memory_fit.py recomputes it from that file.
STRANDED_AT_OOM = 0.022
# The quartiles of the same. A job that fits with the lower but not with the upper fits or
# not by how its tensors fragment: it is "tight", and not refused (a published run that
# trained may have been one that fragments little); `gpusim memory` says it fits tightly.
STRANDED_LOWER_QUARTILE = 0.0057
STRANDED_UPPER_QUARTILE = 0.058
# What PyTorch's caching allocator reserves beyond the peak it hands out (fragmentation and
# cached blocks), as a fraction of that peak: the median of max_memory_reserved /
# max_memory_allocated - 1 over the project's own runs of at least 1 GiB (measurements/
# h100-sxm and h200 models.json: transformers 0.01-0.14, CNNs 0.16-0.55, whose activations
# vary more in size). tests/test_memory_frameworks.py recomputes both from those files.
ALLOCATOR_RESERVE = {"transformer": 0.08, "cnn": 0.25}

# Bytes of optimizer state per trainable parameter. 8-bit AdamW (bitsandbytes) keeps two
# 1-byte states and an fp32 scale per block of 2048 of each (Dettmers et al. 2022,
# "8-bit Optimizers via Block-wise Quantization", section 2).
OPTIMIZER_STATE_BYTES = {"adam": 8.0, "adamw": 8.0, "sgd-momentum": 4.0, "sgd": 0.0,
                         "adamw8bit": 2.0 + 2 * 4 / 2048}

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
    allocator_reserve: float = 0.0  # fraction of the peak the allocator reserves beyond it
    # fraction of the peak the allocator cannot give back when memory runs short
    allocator_stranded: float = 0.0
    communication_buffers: float = 0.0
    optimizer_temporaries: float = 0.0  # what the optimizer step allocates while it runs
    # The part of ``activations`` that is one checkpointed block re-run in backward, and the
    # loss's backward buffers (``transient`` is the largest of any other layer's): the loss's
    # are freed before the first block is re-run, so only the larger of the two is alive.
    recompute_working: float = 0.0
    loss_transient: float = 0.0
    gathered: float = 0.0  # FSDP's gathered units (ZeRO-3), alive throughout the passes
    # NCCL's communicators (gpusim.comm.nccl_memory): held outside PyTorch's caching
    # allocator, like the framework's own, so never in the allocated peak
    nccl_communicators: float = 0.0
    # Whether gradients are held when the backward pass starts: with one microbatch a step
    # they are created by that pass (zero_grad sets them to None), with accumulation they
    # hold the earlier microbatches' sums, and Megatron-LM's live in a persistent buffer.
    # Stepping in backward keeps about one layer's gradients alive throughout the pass.
    gradients_at_backward: bool = True
    # What the layers after the body (final norm, head, loss) keep for backward: autograd
    # has freed it by the time the first checkpointed block is re-run.
    tail_kept: float = 0.0

    def _at_backward(self) -> dict[str, float]:
        """What is alive when the backward pass starts: every activation, the loss's
        gradients (or, later, a checkpointed block re-run), autocast's weight copies."""
        working = self.recompute_working
        # The loss's backward (the block to re-run not yet alive), or the first block's
        # re-run (the loss's and the head's kept tensors freed by then), whichever holds more.
        at_loss = (self.activations - working, self.loss_transient)
        at_rerun = (self.activations - self.tail_kept, self.transient)
        activations, transient = max(at_loss, at_rerun, key=sum)
        return {"weights": self.weights,
                "gradients": self.gradients if self.gradients_at_backward else 0.0,
                "optimizer_states": self.optimizer_states, "weight_copies": self.weight_copies,
                "activations": activations, "transient": transient + self.gathered,
                "communication_buffers": self.communication_buffers,
                "library_workspaces": self.library_workspaces}

    def _at_optimizer(self) -> dict[str, float]:
        """What is alive while the optimizer steps: activations and copies are gone, every
        gradient is there, and the step's own temporaries."""
        return {"weights": self.weights, "gradients": self.gradients,
                "optimizer_states": self.optimizer_states,
                "optimizer_temporaries": self.optimizer_temporaries,
                "communication_buffers": self.communication_buffers,
                "library_workspaces": self.library_workspaces}

    @property
    def peak_phase(self) -> str:
        """Where in the step the peak falls: "backward" (its start) or "optimizer"."""
        backward = sum(self._at_backward().values())
        return "backward" if backward >= sum(self._at_optimizer().values()) else "optimizer"

    @property
    def peak_bytes(self) -> float:
        """Peak allocated bytes, comparable with torch.cuda.max_memory_allocated: the larger
        of the backward pass's start and the optimizer step."""
        return max(sum(self._at_backward().values()), sum(self._at_optimizer().values()))

    @property
    def reserved_bytes(self) -> float:
        """Peak reserved by the caching allocator (torch.cuda.max_memory_reserved): the
        allocated peak and the allocator's reserve, which it gives back before it would
        fail, so never more than the device holds beside what the process keeps outside the
        allocator."""
        return min(self.peak_bytes * (1 + self.allocator_reserve),
                   max(self.peak_bytes, self.capacity - self.outside_allocator_bytes))

    @property
    def stranded_bytes(self) -> float:
        """What the caching allocator cannot hand out at the peak: free space inside
        segments that hold live tensors (STRANDED_AT_OOM)."""
        return self.peak_bytes * self.allocator_stranded

    @property
    def outside_allocator_bytes(self) -> float:
        """What the process holds beside PyTorch's caching allocator: the framework's own
        (CUDA context, handles) and NCCL's communicators."""
        return self.framework_reserved + self.nccl_communicators

    @property
    def required_bytes(self) -> float:
        """The device memory the job needs: its allocated peak, what the allocator strands
        beside it, and what the process holds outside the allocator."""
        return self.peak_bytes + self.stranded_bytes + self.outside_allocator_bytes

    @property
    def usable_bytes(self) -> float:
        """What a process can allocate: ``capacity``, the driver's total."""
        return self.capacity

    def _fits_stranding(self, share: float) -> bool:
        """Whether the job fits when its allocator strands ``share`` of the peak."""
        share = share if self.allocator_stranded else 0.0
        return (self.peak_bytes * (1 + share) + self.outside_allocator_bytes
                <= self.usable_bytes)

    @property
    def fits(self) -> bool:
        """Fits unless even a run that fragments little (the lower quartile) would not."""
        return self._fits_stranding(STRANDED_LOWER_QUARTILE)

    @property
    def free_bytes(self) -> float:
        """What the device has left at the peak (negative: what the job is short by)."""
        return self.usable_bytes - self.required_bytes

    @property
    def tight(self) -> bool:
        """Fits with the lower quartile's stranded share but not with the upper's: whether
        it runs depends on how its tensors fragment."""
        return self.fits and not self._fits_stranding(STRANDED_UPPER_QUARTILE)

    def breakdown(self) -> dict[str, float]:
        """The parts alive at the peak (they sum to ``required_bytes``)."""
        parts = self._at_backward() if self.peak_phase == "backward" else self._at_optimizer()
        keys = ("weights", "gradients", "optimizer_states", "optimizer_temporaries",
                "weight_copies", "activations", "transient", "communication_buffers",
                "library_workspaces")
        return {**{k: parts.get(k, 0.0) for k in keys},
                "allocator_stranded": self.stranded_bytes,
                "nccl_communicators": self.nccl_communicators,
                "framework_reserved": self.framework_reserved}


def activation_split(job: TrainingJob) -> tuple[float, float]:
    """(bytes a microbatch keeps from its forward until its backward, bytes re-created for
    one checkpointed block at a time during backward), under the job's recompute mode
    (``gpusim.plan.recompute``). With activation offloading, what is kept is what stays on
    the device (gpusim.plan.activation_offload)."""
    kept, working = activations_by_layer(job)
    return _on_device(job, kept), working


def _on_device(job: TrainingJob, kept: dict[str, float]) -> float:
    """Bytes of ``kept`` (what each layer keeps for backward) that stay on the device."""
    return offload_split(job, kept)[1] if job.offload_activations else sum(kept.values())


def activations_by_layer(job: TrainingJob,
                         precision: dict[str, LayerPrecision] | None = None
                         ) -> tuple[dict[str, float], float]:
    """What each layer keeps for backward (a checkpointed block's input under the name
    ``<block>.input``), and the bytes re-created for one block at a time. ``precision``:
    the job's layer_precisions, where the caller has them already."""
    layers = job.model.layers
    if precision is None:
        precision = layer_precisions(job)

    fp8_input = job.framework.fp8_saved_input == "fp8"
    # PyTorch's parallel styles gather a sequence-parallel input once, before the module,
    # and autograd keeps the gathered tensor for the weight gradient: a column-parallel
    # product keeps all ``input_shards`` of its input, where Megatron-LM keeps its own shard
    # (Stack.tensor_parallel).
    gathered = job.framework.tensor_parallel == "dtensor"

    def fp8_copy(lay: Layer) -> bool:
        """Whether a product keeps an fp8 copy of its input rather than the input itself."""
        return (fp8_input and isinstance(lay, Linear)
                and precision[lay.name].numerics.matmul == "fp8")

    def saved(lay: Layer) -> float:
        if isinstance(lay, (Linear, Conv2d)) and not job.trains_weights(lay):
            return 0.0  # a frozen product's input gradient needs its weight, not its input
        num = precision[lay.name].numerics
        size = lay.saved_bytes(n, num)
        if gathered and isinstance(lay, Linear):
            size *= lay.input_shards
        if fp8_copy(lay):
            return size / num.act_bytes  # its fp8 copy, a byte each
        if fp8_input and isinstance(lay, MoE) and num.matmul == "fp8":
            # Transformer Engine's GroupedLinear keeps its quantized inputs too
            return size - lay.product_input_bytes(n, num) * (1 - 1 / num.act_bytes)
        return size

    n = job.microbatch_size
    first = next((i for i, lay in enumerate(layers) if job.trains_weights(lay)), len(layers))
    kept = layers[0 if job.input_requires_grad else first:]  # frozen prefix: no autograd
    own = {lay.name: saved(lay) for lay in kept}
    for lay, reader in itertools.pairwise(kept):
        # A fused attention's output is its output projection's input, one tensor kept
        # once, where merging the heads is a view and the projection keeps it as it is
        # (not a frozen base's, not an fp8 copy of it).
        if (isinstance(lay, Attention) and isinstance(reader, Linear)
                and job.trains_weights(reader) and not fp8_copy(reader)):
            own[lay.name] -= lay.shared_output_bytes(n, precision[lay.name].numerics)
    mode = job.checkpointing
    if mode == "none":
        return own, 0.0
    modules = selective_modules(mode)
    if modules:
        # Attention cores keep only their inputs and outputs; scores and softmax statistics
        # are re-created in backward (core_attn). A mixture of experts drops its input, the
        # norm's output, where that norm re-runs (layernorm), and its experts' activations
        # (moe_act), or keeps only its input, checkpointed whole (moe); each is re-created
        # as the experts' backward starts.
        kept_by = dict(own)
        rerun = 0.0
        blocks: dict[str, list[Layer]] = defaultdict(list)
        for lay in kept:
            if lay.block:
                blocks[lay.block].append(lay)
        previous: Layer | None = None
        readers: list[Layer | None] = [*kept[1:], None]
        for lay, after in zip(kept, readers, strict=True):
            num = precision[lay.name].numerics
            if "core_attn" in modules and isinstance(lay, Attention):
                kept_by[lay.name] = lay.io_bytes(n, num)
            if after is not None and recomputed_norm(lay, after, modules):
                dropped = float(n * lay.out_elements * num.act_bytes)
                kept_by[after.name] -= dropped
                rerun = max(rerun, dropped)
            if "moe" in modules and isinstance(lay, MoE):
                # its input, unless the norm before it re-runs and re-creates that too
                normed = previous is not None and recomputed_norm(previous, lay, modules)
                kept_by[lay.name] = 0.0 if normed else float(
                    n * lay.rows * lay.hidden * num.act_bytes)
                rerun = max(rerun, own[lay.name])
            elif "moe_act" in modules and isinstance(lay, MoE):
                dropped = lay.activation_bytes(n, num)
                kept_by[lay.name] -= dropped
                rerun = max(rerun, dropped)
            if "mla_up_proj" in modules and isinstance(lay, Attention) and any(
                    la.name.endswith(MLA_UP_PROJ) for la in blocks.get(lay.block, [])):
                # the up-projected queries, keys and values the core keeps
                dropped = lay.io_bytes(n, num)
                kept_by[lay.name] -= dropped
                rerun = max(rerun, dropped)
            previous = lay
        if "mlp" in modules:
            # a checkpointed dense MLP keeps its input, one hidden-sized tensor, and re-runs
            for members in blocks.values():
                down = next((la for la in members if la.name.endswith(DENSE_MLP[-1])), None)
                mlp = rerun_with(down, members, modules) if down is not None else []
                if not mlp:
                    continue
                opener = mlp[0]
                num = precision[opener.name].numerics
                rerun = max(rerun, sum(kept_by[la.name] for la in mlp if la.name in kept_by))
                for la in mlp:
                    if la.name in kept_by:
                        kept_by[la.name] = 0.0
                if opener.name in kept_by:
                    kept_by[opener.name] = float(n * _input_elements(opener) * num.act_bytes)
        return kept_by, rerun
    # A checkpointed block keeps its input (and what a per-op policy saves) and re-creates
    # the rest one block at a time; other layers keep what they save.
    checkpointed = checkpointed_blocks(mode, job.model)
    per_block: dict[str, float] = {}
    out: dict[str, float] = {}
    previous_out = 0
    for lay in kept:
        num = precision[lay.name].numerics
        if lay.block not in checkpointed:
            out[lay.name] = own[lay.name]
        else:
            if lay.block not in per_block:
                per_block[lay.block] = 0.0
                entering = _input_elements(lay) or previous_out
                out[f"{lay.block}.input"] = float(n * entering * num.act_bytes)
            per_block[lay.block] += own[lay.name]
            if mode == "per-op":
                out[lay.name] = policy_kept_bytes(lay, n, num)
        previous_out = lay.out_elements
    return out, max(per_block.values(), default=0.0)


def _input_elements(layer: Layer) -> int:
    """Elements per sample of the input a block's first layer reads, where its shape says
    it (0: take the layer before it): a norm's input, or a product's as it keeps it. Under
    sequence parallelism that is the sequence shard the embedding's reduce-scatter leaves,
    and on a later pipeline stage the activation it received."""
    if isinstance(layer, Elementwise) and layer.op in ("layer_norm", "rms_norm"):
        return layer.elements
    if isinstance(layer, Linear):
        return layer.rows * layer.in_features // layer.input_shards
    return 0


def _loss_transient(layer: CrossEntropy, job: TrainingJob, num: Numerics) -> float:
    """The loss's backward buffers: PyTorch's two logits-sized gradients; under tensor
    parallelism with a dtensor stack, PyTorch's loss_parallel, whose fused backward
    (torch/distributed/tensor/parallel/loss.py, _nll_loss_and_log_softmax_backward) fills
    zeros_like(log-probabilities), then computes (that + exp(log-probabilities)) times the
    loss gradient: three tensors of the logits shard, in the loss's type, alive at once
    beside the kept log-probabilities, where PyTorch's own cross-entropy has two; where the
    job has Megatron-LM's ``master_weights``, Megatron-LM's vocabulary-parallel loss, which
    turns its kept fp32 softmax into the gradient in place
    (megatron/core/tensor_parallel/cross_entropy.py, backward) and allocates only the cast
    back to the logits' type."""
    if layer.fused:
        return layer.transient_bytes(job.microbatch_size, num)
    if job.framework.tensor_parallel == "dtensor" and job.tensor_parallel > 1:
        return 1.5 * layer.transient_bytes(job.microbatch_size, num)
    if job.master_weights:
        n = job.microbatch_size
        cast = layer.upcast and num.act_bytes < DTYPE_BYTES["fp32"]
        return float(n * layer.rows * layer.classes * num.act_bytes) if cast else 0.0
    return layer.transient_bytes(job.microbatch_size, num)


def _kept_by_loss(job: TrainingJob) -> frozenset[str]:
    """The layers whose output a fused loss keeps as it is (the head's logits, under a
    compiled or fused cross-entropy): that output is among the activations already, and the
    one logits-sized gradient the loss writes is its transient, so the head's own output
    and gradient are not counted a second time."""
    return frozenset(before.name for before, layer in itertools.pairwise(job.model.layers)
                     if isinstance(layer, CrossEntropy) and layer.fused)


def memory_plan(job: TrainingJob, split: tuple[float, float] | None = None) -> MemoryPlan:
    """The peak memory of ``job`` by category (raises nothing; ``remedies.check_fits`` does).
    ``split`` is its activation_split when the caller has it already."""
    layers = job.model.layers
    num = job.numerics()
    n = job.microbatch_size
    trainable = sum(lay.params for lay in layers if job.is_trainable(lay.name))
    # Autocast's cached 16-bit copies of the weights it casts, kept from forward to backward.
    copies = float(sum(lay.params * num.act_bytes for lay in layers if casts_weight(lay, job))
                   if job.device.is_gpu else 0.0)
    master = (float(job.state_bytes) * trainable if job.master_weights and job.mixed_precision
              else 0.0)
    # Pure bf16: the optimizer's states take the parameters' type (8-bit states stay 8-bit);
    # bf16 states likewise.
    state_scale = job.state_bytes / 4 if job.optimizer != "adamw8bit" else 1.0
    # The largest layer output and its gradient alive together during backward; the loss's
    # apart (see MemoryPlan.loss_transient).
    precision = layer_precisions(job)
    kept_by_loss = _kept_by_loss(job)
    transient = max((lay.transient_bytes(n, precision[lay.name].numerics) for lay in layers
                     if not isinstance(lay, CrossEntropy) and lay.name not in kept_by_loss),
                    default=0.0)
    loss_transient = max((_loss_transient(lay, job, precision[lay.name].numerics)
                          for lay in layers if isinstance(lay, CrossEntropy)), default=0.0)
    by_layer: dict[str, float] | None = None
    if split is None:
        by_layer, working = activations_by_layer(job, precision)
        kept = _on_device(job, by_layer)
    else:
        kept, working = split
    tail_kept = 0.0
    if working:
        if by_layer is None:
            by_layer = activations_by_layer(job, precision)[0]
        tail = {lay.name for lay in job.model.partition()[2]}
        tail_kept = sum(v for name, v in by_layer.items() if name in tail)
    reserved = FRAMEWORK_RESERVED_BYTES if job.device.is_gpu else 0.0
    # PyTorch's foreach Adam on a GPU computes sqrt(v) for every parameter at once before
    # its in-place update (torch/optim/adam.py, _multi_tensor_adam: exp_avg_sq_sqrt); the
    # fused and 8-bit kernels, a per-tensor loop and Megatron-LM's fused step allocate
    # nothing of that size.
    stack = job.framework
    foreach = (job.device.is_gpu and job.optimizer in ("adam", "adamw")
               and stack.optimizer == "foreach" and not job.master_weights)
    temporaries = trainable * (2.0 if job.pure_bf16 else 4.0) if foreach else 0.0
    trained = [lay for lay in layers if lay.params and job.is_trainable(lay.name)]
    largest = max((size for lay in trained for size in lay.tensor_sizes()), default=0)
    if job.optimizer == "adafactor":
        # Adafactor keeps a matrix's second moment factored (its row and column means) and
        # a vector's whole, in fp32 whatever the weights' type (transformers Adafactor.step
        # upcasts 16-bit gradients before it creates its state); and, a tensor at a time,
        # the squared gradient and the factors' outer product (a 16-bit weight's fp32 copy
        # too) are alive beside it.
        states = DTYPE_BYTES["fp32"] * sum(size for lay in trained
                                           for size in lay.factored_sizes()) + master
        alive = 2 + (job.weight_bytes < DTYPE_BYTES["fp32"])  # tensor-sized temporaries
        temporaries = DTYPE_BYTES["fp32"] * largest * alive
    else:
        states = OPTIMIZER_STATE_BYTES[job.optimizer] * trainable * state_scale + master
    weights = float(job.weight_bytes * trainable
                    + sum(lay.params * job.frozen_bytes(lay) for lay in layers
                          if not job.is_trainable(lay.name)))
    gradients = float(job.grad_bytes * trainable)
    if job.optimizer_in_backward:
        # Each parameter steps as soon as its gradient is accumulated and the gradient is
        # freed (torchtune/modules/optim.py, OptimizerInBackward._step_and_clear; before
        # 2025 torchtune/training/memory.py, register_optim_in_bwd_hooks; both on PyTorch's
        # register_post_accumulate_grad_hook), one optimizer per parameter: about one
        # layer's gradients are alive at a time, and a foreach step's temporaries are one
        # tensor's.
        gradients = float(job.grad_bytes * max((lay.params for lay in trained), default=0))
        if foreach:
            temporaries = largest * (2.0 if job.pure_bf16 else 4.0)
    if job.offload != "none":  # the step, its states and master weights live on the host
        states = temporaries = 0.0
    if job.offload == "params":  # FSDP's weight and gradient shards too
        weights = gradients = 0.0
    return MemoryPlan(
        weights=weights,
        gradients=gradients,
        optimizer_states=states,
        weight_copies=copies,
        activations=kept + working,
        transient=float(transient),
        recompute_working=working,
        loss_transient=float(loss_transient),
        framework_reserved=reserved,
        capacity=job.device.usable_memory_bytes,
        library_workspaces=library_workspace_bytes(job),
        allocator_reserve=ALLOCATOR_RESERVE.get(job.model.family, 0.0)
        if job.device.is_gpu else 0.0,
        allocator_stranded=STRANDED_AT_OOM if job.device.is_gpu else 0.0,
        optimizer_temporaries=temporaries,
        tail_kept=tail_kept,
        gradients_at_backward=(job.grad_accum > 1 or job.master_weights
                               or stack.zero_grad == "zeros" or job.optimizer_in_backward),
    )
