"""gpusim's memory plan beside Megatron-LM's own theoretical memory formulas, on the Megatron
dev cases (gpusim.validate.megatron).

Megatron-LM prints a theoretical footprint (megatron/training/theoretical_memory_usage.py,
NVIDIA/Megatron-LM @00caa53a): weights and optimizer at 18 bytes a parameter of the most
loaded shard (16-bit weight, fp32 gradient, fp32 master weight and two Adam moments; 6 +
12/DP with its distributed optimizer), and activations by Korthikanti et al. 2022, Table 2,
for selective recompute with sequence parallelism: per layer s b h (18 + 4 ffn / h) bytes
over TP, times the layers the first stage holds in flight, plus the embedding's input and
dropout and, without pipelining, the output layer and loss, 4 s b h (1 + V / h). Written
here from those definitions. It counts no CUDA context, library workspace, allocator reserve
or transient buffer, which gpusim's plan adds; those are reported apart.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpusim.plan.parallel import plan_parallel
from gpusim.plan.parallel_job import ParallelJob
from gpusim.plan.stage_memory import stage_memory
from gpusim.validate.megatron import MegatronCase, job_for


def megatron_weight_optimizer_bytes(case: MegatronCase, distributed_optimizer: bool = False
                                    ) -> float:
    """Bytes of weights, gradients and optimizer states on the most loaded rank."""
    h, layers, vocab = case.hidden, case.layers, case.vocab
    ffn = 4 * h
    # attention (QKV and output, no GQA) and MLP weights, two layer norms with biases
    per_layer = 2 * h * h * 2 + 2 * h * (ffn + 2)
    block = per_layer * layers + 2 * h  # and the final layer norm
    embedding = h * vocab
    shard = (block / case.pp + embedding) / case.tp  # the first stage holds the embedding
    per_param = 6 + 12 / case.dp if distributed_optimizer else 18
    return shard * per_param


def megatron_activation_bytes(case: MegatronCase, microbatches: int) -> float:
    """Activations of the first stage under selective recompute with sequence parallelism
    (Korthikanti et al. 2022, Table 2), as Megatron-LM's formula counts them."""
    s, b, h, pp = case.seq_len, case.microbatch, case.hidden, case.pp
    ffn = 4 * h
    total = s * b * h * (18 + 4 * ffn / h) * case.layers
    total += 8 * s * b * pp + s * b * h * pp  # the embedding's input ids and its dropout
    if case.virtual_stages > 1:
        total *= 1 + (pp - 1) / (pp * case.virtual_stages)
    elif pp > 1:
        total *= min(1.0, microbatches / pp)
    if pp == 1:
        total += s * b * h * 4 * (1 + case.vocab / h)  # the output layer and the loss
    return total / case.tp


@dataclass(frozen=True)
class MemoryComparison:
    case: MegatronCase
    megatron_states: float
    gpusim_states: float
    megatron_activations: float
    gpusim_activations: float
    gpusim_other: float  # transient, workspaces, context: what Megatron's formula leaves out


def selective_job(case: MegatronCase) -> ParallelJob:
    """The case as Megatron's formula assumes it: selective recompute, sequence parallel."""
    job = job_for(case)
    return replace(job, checkpointing="selective",
                   parallel=replace(job.parallel, sequence_parallel=case.tp > 1))


def compare(case: MegatronCase) -> MemoryComparison:
    job = selective_job(case)
    plan = plan_parallel(job)
    mem = stage_memory(plan, plan.stages[0])
    states = mem.weights + mem.gradients + mem.optimizer_states
    other = mem.required_bytes - states - mem.activations
    return MemoryComparison(case, megatron_weight_optimizer_bytes(case), states,
                            megatron_activation_bytes(case, job.microbatches),
                            mem.activations, other)
