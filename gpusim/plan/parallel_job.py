"""A parallel training job: the split (TP x PP x DP, microbatch, schedule, ZeRO) and the job
it applies to, checked: splits that do not divide are ``InvalidConfig`` with a plain message.

Ranks are laid out as Megatron-LM lays them out (tensor innermost, then data, then pipeline).
Planning and costing the split is ``gpusim.plan.parallel``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from gpusim.comm.topology import Topology
from gpusim.errors import InvalidConfig
from gpusim.hardware.catalog import load_cpu
from gpusim.plan.context_parallel import check_context
from gpusim.plan.expert_parallel import check_experts
from gpusim.plan.job import (
    Checkpointing,
    Optimizer,
    TrainingJob,
    TrainingPrecision,
    in_prefix,
)
from gpusim.plan.offload import check_offload
from gpusim.plan.recompute import parse_recompute
from gpusim.stack import Stack
from gpusim.workload.attention import Attention
from gpusim.workload.layers import Layer
from gpusim.workload.model import Model

Schedule = Literal["gpipe", "1f1b", "interleaved"]
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved")
EP_DISPATCHERS = ("alltoall", "deepep", "hybridep")
# Dispatchers that send a token once per destination rank inside a node and once per
# destination node across nodes
DEDUP_DISPATCHERS = ("deepep", "hybridep")
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class ParallelConfig:
    """How a job is split. ``microbatch_size`` is samples per GPU per forward pass.

    ``overlap_grad_reduce``: data-parallel gradient reduction runs in buckets during the last
    backward pass (PyTorch DDP); False reduces the whole gradient buffer after it (Megatron-LM's
    2021 "local" DDP).
    """

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    microbatch_size: int = 1
    schedule: Schedule = "1f1b"
    virtual_stages: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    overlap_grad_reduce: bool = True
    # Blocks on each pipeline stage, first to last (empty: the same on every stage). Frameworks
    # put fewer on the first and last stages, which also hold the embedding and the head.
    stage_blocks: tuple[int, ...] = ()
    # ZeRO-3 hybrid sharding (HSDP): shard over groups of this many data-parallel ranks and
    # replicate across the groups (0: shard over all of them).
    shard_group: int = 0
    # Context parallelism: of the ``data`` ranks, groups of this many (adjacent, inside a
    # node) split each sample's sequence rather than take samples of their own. For weights
    # and gradients they count as data-parallel ranks (gpusim.plan.context_parallel).
    context: int = 1
    # Expert parallelism: groups of this many data-parallel ranks (adjacent, inside a node)
    # each hold 1/expert of every MoE layer's experts and exchange tokens by all-to-all.
    expert: int = 1
    # Tensor-parallel collectives split into chunks and run beside the products they feed or
    # follow (Megatron-LM's --tp-comm-overlap, PyTorch's async TP); needs sequence parallelism
    tp_overlap: bool = False
    # Tensor-parallel ranks that split each expert (Megatron-LM's --expert-tensor-parallel-size;
    # 0: TP itself while EP fits inside the data-parallel ranks, else what EP leaves of TP).
    # Fewer than TP folds EP over tensor x data ranks, innermost first (MoE parallel folding).
    expert_tensor_size: int = 0
    # Expert-parallel all-to-alls of one microbatch run on their own stream beside another
    # microbatch's compute (Megatron-LM's --overlap-moe-expert-parallel-comm, its combined
    # 1F1B schedule): what a pass's compute cannot cover stays exposed
    ep_overlap: bool = False
    # How tokens reach their experts' ranks: "alltoall", one copy per chosen expert (NCCL's
    # all-to-all, Megatron-LM's alltoall dispatcher); "deepep", one copy per destination rank
    # inside a node and per destination node across nodes, forwarded over NVLink there
    # (DeepSeek's DeepEP, Megatron-LM's flex dispatcher with --moe-enable-deepep);
    # "hybridep", NVIDIA's HybridEP (DeepEP's hybrid-ep branch, Megatron's flex backend
    # hybridep), hierarchical the same way (its docs: RDMA across nodes, NVLink inside),
    # costed alike
    ep_dispatcher: str = "alltoall"
    # The busiest expert-parallel rank's token copies over the mean (--moe-imbalance; 1:
    # balanced routing, as forced load balancing gives)
    moe_imbalance: float = 1.0
    # Experts' capacity as a factor of the mean token copies (0: dropless): copies beyond
    # it dropped, or with moe_pad every expert fed exactly that many (Megatron-LM's
    # --moe-expert-capacity-factor, --moe-pad-expert-input-to-capacity)
    moe_capacity: float = 0.0
    moe_pad: bool = False

    @property
    def shard_ranks(self) -> int:
        """Data-parallel ranks that weights, gradients and optimizer states are sharded over."""
        return self.shard_group or self.data

    def __post_init__(self) -> None:
        for name in ("tensor", "pipeline", "data", "microbatch_size", "virtual_stages",
                     "context", "expert"):
            value = getattr(self, name)
            if value < 1:
                raise InvalidConfig(f"{name.replace('_', ' ')} must be at least 1 (got {value})")
        if self.schedule not in SCHEDULES:
            raise InvalidConfig(f"unknown schedule {self.schedule!r}; use one of "
                                f"{', '.join(SCHEDULES)}")
        if self.zero not in ZERO_STAGES:
            raise InvalidConfig(f"ZeRO stage must be 0, 1, 2 or 3 (got {self.zero})")
        if self.stage_blocks:
            chunks = self.pipeline * self.virtual_stages
            if len(self.stage_blocks) != chunks:
                per = ("stage" if self.virtual_stages == 1
                       else f"model chunk (PP x virtual stages = {chunks})")
                raise InvalidConfig(f"--pp-layers gives {len(self.stage_blocks)} counts; give "
                                    f"one per {per}")
            # the first and last chunks hold the embedding and the head, so they may hold
            # no block (Megatron-LM's account_for_embedding/loss_in_pipeline_split)
            if min(self.stage_blocks[1:-1], default=1) < 1 or min(self.stage_blocks) < 0:
                raise InvalidConfig("every pipeline stage but the first and last needs at "
                                    "least one block (--pp-layers)")
        if self.data % self.context:
            raise InvalidConfig(f"context parallelism {self.context} does not divide the "
                                f"{self.data} data-parallel ranks")
        if self.data % self.expert and (self.expert % self.data
                                        or self.tensor % (self.expert // self.data)):
            raise InvalidConfig(
                f"expert parallelism {self.expert} neither divides the {self.data} "
                f"data-parallel ranks nor spans tensor x data ranks (TP {self.tensor} x DP "
                f"{self.data}); pick an EP that does")
        if self.expert_tensor_size and (self.tensor % self.expert_tensor_size
                                        or (self.tensor * self.data)
                                        % (self.expert * self.expert_tensor_size)):
            raise InvalidConfig(
                f"expert tensor parallelism {self.expert_tensor_size} must divide TP "
                f"{self.tensor}, and EP {self.expert} x it must divide TP x DP "
                f"({self.tensor * self.data}); pick an --etp that does")
        if self.expert_tensor < self.tensor and not self.sequence_parallel:
            raise InvalidConfig(f"EP {self.expert} over tensor-parallel ranks splits the "
                                f"tokens between them: it needs --sequence-parallel")
        if self.context > 1 and self.shard_group:
            raise InvalidConfig("--cp does not combine with --shard-group yet")
        if self.shard_group:
            if self.zero != 3:
                raise InvalidConfig("--shard-group shards like FSDP inside each group: it "
                                    "needs --zero 3")
            if self.shard_group > self.data or self.data % self.shard_group:
                raise InvalidConfig(f"--shard-group {self.shard_group} does not divide the "
                                    f"{self.data} data-parallel ranks")
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise InvalidConfig("--virtual-stages applies to --schedule interleaved only")
        if self.schedule == "interleaved" and self.pipeline == 1:
            raise InvalidConfig("the interleaved schedule needs pipeline parallelism (--pp > 1)")
        if self.tp_overlap and not self.sequence_parallel:
            raise InvalidConfig("--tp-overlap overlaps sequence parallelism's gathers and "
                                "reduce-scatters: it needs --sequence-parallel (and --tp > 1)")
        if self.ep_dispatcher not in EP_DISPATCHERS:
            raise InvalidConfig(f"unknown expert-parallel dispatcher {self.ep_dispatcher!r}; "
                                f"use one of {', '.join(EP_DISPATCHERS)}")
        if not 1.0 <= self.moe_imbalance <= self.expert:
            raise InvalidConfig(f"--moe-imbalance is the busiest expert-parallel rank's tokens "
                                f"over the mean: from 1 (balanced) to the EP size "
                                f"{self.expert} (every token on one rank); got "
                                f"{self.moe_imbalance:g}")
        if self.moe_capacity < 0:
            raise InvalidConfig(f"--capacity-factor is a positive factor of the mean tokens "
                                f"an expert gets (1.0: exactly the mean); got "
                                f"{self.moe_capacity:g}")
        if self.moe_pad and not self.moe_capacity:
            raise InvalidConfig("--pad-to-capacity pads every expert's tokens up to its "
                                "capacity: it needs --capacity-factor")
        if self.ep_overlap and self.expert == 1:
            raise InvalidConfig("--ep-overlap overlaps expert-parallel all-to-alls: it needs "
                                "--ep > 1 (and a mixture-of-experts model)")
        if self.sequence_parallel and self.tensor == 1:
            raise InvalidConfig("sequence parallelism splits along tensor-parallel ranks; it "
                                "needs --tp > 1")
        if self.zero >= 2 and self.pipeline > 1:
            raise InvalidConfig(
                f"ZeRO stage {self.zero} shards gradients, which pipeline parallelism "
                f"accumulates across microbatches (DeepSpeed and Megatron-LM refuse the "
                f"combination); use --zero 0 or 1 with --pp > 1"
            )

    @property
    def expert_tensor(self) -> int:
        """Tensor-parallel ranks that split each expert: TP itself while EP fits inside the
        data-parallel ranks; fewer when EP also spans tensor-parallel ranks (Megatron-LM's
        MoE parallel folding, expert_tensor_parallel_size), 1 when it spans them all; or
        as given (expert_tensor_size)."""
        if self.expert_tensor_size:
            return self.expert_tensor_size
        if self.expert <= self.data:
            return self.tensor
        return self.tensor * self.data // self.expert

    @property
    def expert_data(self) -> int:
        """Ranks that hold the same experts, over which their gradients and ZeRO states
        are spread: tensor x data ranks over expert x expert-tensor ranks."""
        return max(1, self.tensor * self.data // (self.expert * self.expert_tensor))

    @property
    def num_gpus(self) -> int:
        return self.tensor * self.pipeline * self.data

    def describe(self) -> str:
        cp = f"CP {self.context} x " if self.context > 1 else ""
        text = (f"TP {self.tensor} x {cp}PP {self.pipeline} x DP {self.data // self.context}, "
                f"microbatch {self.microbatch_size}")
        if self.pipeline > 1:  # a schedule orders the stages; one stage has nothing to order
            text += f", {self.schedule}"
        if self.virtual_stages > 1:
            text += f" ({self.virtual_stages} virtual stages)"
        if self.expert > 1:
            text += f", EP {self.expert}"
            if self.expert_tensor_size:
                text += f" (expert TP {self.expert_tensor_size})"
        if self.zero:
            text += f", ZeRO-{self.zero}"
        if self.shard_group and self.shard_group < self.data:
            text += (f" sharded over {self.shard_group}, replicated "
                     f"{self.data // self.shard_group}x")
        if self.sequence_parallel:
            text += ", sequence parallel"
        if self.tp_overlap:
            text += ", TP comm overlapped"
        if self.ep_overlap:
            text += ", EP all-to-alls overlapped"
        if self.expert > 1 and self.ep_dispatcher != "alltoall":
            text += f", {self.ep_dispatcher} dispatch"
        if self.expert > 1 and self.moe_imbalance != 1.0:
            text += f", busiest EP rank at {self.moe_imbalance:g}x the mean tokens"
        if self.moe_capacity:
            text += (f", experts {'padded' if self.moe_pad else 'capped'} at "
                     f"{self.moe_capacity:g}x the mean tokens")
        return text


@dataclass(frozen=True)
class ParallelJob:
    """One optimizer step of ``model`` over ``topology``; ``batch_size`` is the global batch."""

    model: Model
    topology: Topology
    batch_size: int
    parallel: ParallelConfig
    precision: TrainingPrecision = "bf16"
    optimizer: Optimizer = "adam"
    checkpointing: Checkpointing = "none"
    # None: Megatron-LM semantics under tensor or pipeline parallelism, PyTorch's otherwise.
    megatron: bool | None = None
    frozen: tuple[str, ...] = ()  # layer-name prefixes whose weights do not train
    # Data-loader processes per data-parallel replica; 0 feeds synthetic input on the device.
    loader_workers: int = 0
    pure_bf16: bool = False  # the model held in bf16, states too (see TrainingJob)
    stack: Stack | None = None  # how the framework runs the step (None: the default stack)
    offload: str = "none"  # optimizer or params in host memory (gpusim.plan.offload)
    quantized_base: bool = False  # frozen projections held in 4-bit NF4 (QLoRA)
    adapters_only: bool = False  # LoRA: only the adapters train, the base is frozen
    fp8_recipe: str = "tensorwise"  # with precision fp8: how scales are found (workload/fp8.py)
    bf16_grads: bool = False  # gradients accumulated and reduced in bf16 (see TrainingJob)
    bf16_states: bool = False  # the optimizer's states in bf16 (see TrainingJob)

    def __post_init__(self) -> None:
        p = self.parallel
        if self.loader_workers < 0:
            raise InvalidConfig(f"--loader-workers must be 0 or more (got "
                                f"{self.loader_workers})")
        if p.num_gpus != self.topology.num_gpus:
            raise InvalidConfig(
                f"TP {p.tensor} x PP {p.pipeline} x DP {p.data} = {p.num_gpus} GPUs, but the "
                f"job has {self.topology.num_gpus}; make the product equal --num-gpus"
            )
        per_step = p.microbatch_size * p.data // p.context
        if self.batch_size % per_step:
            raise InvalidConfig(
                f"global batch {self.batch_size} is not a multiple of microbatch "
                f"{p.microbatch_size} x DP {p.data // p.context} = {per_step}"
            )
        if p.schedule == "interleaved" and self.microbatches % p.pipeline:
            raise InvalidConfig(
                f"the interleaved schedule needs the microbatches per pipeline "
                f"({self.microbatches}) to be a multiple of PP {p.pipeline}"
            )
        check_offload(self.offload, p.zero)
        if parse_recompute(self.checkpointing) != self.checkpointing:
            object.__setattr__(self, "checkpointing", parse_recompute(self.checkpointing))
        if p.tensor > 1 or p.pipeline > 1:
            _check_splits(self.model, p)
        check_context(self.model, p.context)
        check_experts(self.model, p.expert)
        _ = self.whole  # checks precision against the GPU, checkpointing, frozen names, ...

    @property
    def microbatches(self) -> int:
        """Microbatches each pipeline runs per step (gradient accumulation when PP is 1)."""
        p = self.parallel
        return self.batch_size * p.context // (p.microbatch_size * p.data)

    @property
    def host_cores_per_replica(self) -> int | None:
        """Physical CPU cores of the node that one data-parallel replica's loader may use:
        the node's cores shared evenly by its GPUs, times the replica's TP GPUs (None when
        the system names no CPU)."""
        system = self.topology.system
        if system.cpu is None or not system.cpus_per_node:
            return None
        cores = load_cpu(system.cpu).compute_units * system.cpus_per_node
        return max(1, cores * self.parallel.tensor // self.topology.gpus_per_node)

    @property
    def input_interval_s(self) -> float:
        """Seconds between microbatches a replica's loader workers deliver in steady state
        (0 for synthetic input): each worker prepares a whole microbatch, and workers beyond
        the replica's share of the node's cores run no faster."""
        if self.loader_workers == 0:
            return 0.0
        cores = self.host_cores_per_replica
        workers = self.loader_workers if cores is None else min(self.loader_workers, cores)
        return self.parallel.microbatch_size * self.model.input.loader_cpu_s / workers

    @property
    def master_weights(self) -> bool:
        """Model-parallel frameworks (Megatron-LM) keep weights in the compute type with fp32
        master copies, as does any job whose stack holds its weights that way; data
        parallelism alone is otherwise taken as PyTorch DDP with autocast unless ``megatron``
        says otherwise."""
        if self.megatron is not None:
            return self.megatron
        if self.pure_bf16:  # a model held in bf16 has no fp32 copy to keep (torchtitan,
            return False    # NeMo AutoModel and torchtune pipeline it so)
        if self.stack is not None and self.stack.weights == "master":
            return True
        if (self.stack is not None and self.stack.tensor_parallel == "dtensor"
                and self.parallel.pipeline == 1):
            # PyTorch's parallel styles compose with FSDP2's mixed precision: fp32 shards
            # gathered in the compute type, no 16-bit weights with master copies. (Under
            # pipeline stages FSDP2 keeps each stage's 16-bit weights gathered through the
            # step, reshard_after_forward off, beside its fp32 shards: as master copies are.)
            return False
        return self.parallel.tensor > 1 or self.parallel.pipeline > 1

    @property
    def freezes(self) -> bool:
        """Whether some weights do not train (frozen prefixes, or a LoRA base)."""
        return bool(self.frozen) or self.adapters_only

    @property
    def fsdp(self) -> bool:
        """ZeRO-3 without Megatron-LM semantics is PyTorch FSDP (full sharding) with its
        mixed precision: fp32 weight shards, gathered a unit at a time in the compute type."""
        return self.parallel.zero == 3 and not self.master_weights

    @property
    def gathered_weight_bytes(self) -> int:
        """Bytes per weight that ZeRO-3 gathers (TrainingJob.gathered_weight_bytes)."""
        return self.whole.gathered_weight_bytes

    @cached_property
    def whole(self) -> TrainingJob:
        """The whole model as one device's job: its numerics and per-element byte sizes."""
        return self.stage_job(self.model)

    def stage_job(self, model: Model, *, first: bool = True) -> TrainingJob:
        """A single-device job for one microbatch of a stage's layers."""
        # A stage is told only the prefixes among its layers; the whole model checks them all.
        frozen = self.frozen
        if frozen and model is not self.model:
            names = [layer.name for layer in model.layers]
            frozen = tuple(f for f in self.frozen if any(in_prefix(n, f) for n in names))
        return TrainingJob(model, self.topology.gpu, self.parallel.microbatch_size,
                           self.precision, 1, self.optimizer, self.checkpointing, frozen,
                           loader_workers=0, master_weights=self.master_weights,
                           input_requires_grad=not first, fsdp=self.fsdp,
                           pure_bf16=self.pure_bf16, stack=self.stack,
                           offload=self.offload, quantized_base=self.quantized_base,
                           adapters_only=self.adapters_only, fp8_recipe=self.fp8_recipe,
                           tensor_parallel=self.parallel.tensor, bf16_grads=self.bf16_grads,
                           bf16_states=self.bf16_states)

    @cached_property
    def model_flops_per_sample(self) -> float:
        """Model FLOPs of one sample, forward and backward; with layers frozen, only the
        backward that runs: no weight gradients for them, no input gradients before the
        first layer that trains."""
        if not self.freezes:
            return self.model.training_flops_per_sample
        return self.model.training_flops(self.whole.trains_weights)

    def trainable_params(self, layers: tuple[Layer, ...] | list[Layer]) -> int:
        """Parameters of ``layers`` that train: what gradients are reduced and stepped for."""
        return sum(la.params for la in layers if self.whole.trains_weights(la))


def _check_splits(model: Model, p: ParallelConfig) -> None:
    if model.family != "transformer" and p.tensor > 1:
        raise InvalidConfig(f"tensor parallelism splits transformer layers; {model.name} is a "
                            f"{model.family} model (use --tp 1)")
    for layer in model.layers:
        if isinstance(layer, Attention) and layer.tp == "sharded":
            if layer.heads % p.tensor:
                raise InvalidConfig(f"{model.name} has {layer.heads} attention heads, which "
                                    f"do not split over TP {p.tensor}; pick a TP that divides "
                                    f"them")
            kv = layer.kv_heads or layer.heads
            if kv % p.tensor and p.tensor % kv:
                raise InvalidConfig(f"{model.name} has {kv} key/value heads, which neither "
                                    f"split over nor replicate across TP {p.tensor}")
            break
    body = len(model.partition()[1])
    if p.stage_blocks:
        if sum(p.stage_blocks) != body:
            raise InvalidConfig(f"--pp-layers {','.join(map(str, p.stage_blocks))} adds up to "
                                f"{sum(p.stage_blocks)} blocks; {model.name} has {body}")
        return
    chunks = p.pipeline * p.virtual_stages
    if body % chunks:
        what = f"PP {p.pipeline}" + (f" x {p.virtual_stages} virtual stages"
                                     if p.virtual_stages > 1 else "")
        hint = ""
        if p.virtual_stages == 1 and body >= p.pipeline:
            hint = f", or give each stage's blocks: --pp-layers {uneven_split(body, p.pipeline)}"
        raise InvalidConfig(f"{model.name}'s {body} blocks do not split evenly over {what}; "
                            f"pick a pipeline size that divides {body}{hint}")


def uneven_split(blocks: int, stages: int) -> str:
    """Blocks per stage as evenly as they go, the remainder taken off the first and last
    stages (which also hold the embedding and the head)."""
    base, extra = divmod(blocks, stages)
    counts = [base] * stages
    if extra:
        counts = [base + 1] * stages
        short = stages - extra  # stages that hold one block fewer, outermost first
        order = [i for pair in zip(range(stages), reversed(range(stages)), strict=True)
                 for i in pair]
        for i in list(dict.fromkeys(order))[:short]:
            counts[i] -= 1
    return ",".join(map(str, counts))
