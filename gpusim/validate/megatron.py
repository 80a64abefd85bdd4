"""Published Megatron-LM training figures, and gpusim's prediction of each.

The figures are measured runs as NVIDIA published them; gpusim never fits to them. Sources:

- SC'21 (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", Table 1; NVIDIA/Megatron-LM README @50a4b5fa02, image
  cases_april2021.png): achieved TFLOP/s per A100, end to end. Split, microbatch, virtual
  stages, recompute and DDP implementation from examples/sc21/run_table_1.sh @4d1c207597.
- 2020 tables (NVIDIA/Megatron-LM images/tables.tex @5281919420^, README @5281919420):
  iteration time in ms for tensor-parallel weak scaling on one DGX-2 (V100) or DGX A100 node,
  and for data-parallel scaling on DGX A100 nodes. These DGX A100s are the 320GB launch model
  (A100 40GB, 1555 GB/s): the 80 GB A100 was announced on 2020-11-16, after the tables.

Both report TFLOP/s with the paper's formula 96 B s l h^2 (1 + s / 6h + V / 16 l h), which
counts the recomputed forward pass: the runs used full activation checkpointing, taken here
for the 2020 rows too (their TFLOP/s figures follow that formula). Megatron-LM of that time
ran unfused attention (scores in memory), dropout 0.1, fp16 with fp32 master weights, and
its own "local" DDP unless told otherwise (``--DDP-impl`` defaulted to local in megatron/
arguments.py then), which all-reduces the gradient buffer after the backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpusim.comm.topology import Topology
from gpusim.estimation import simulate_parallel_step
from gpusim.plan.parallel_job import ParallelConfig, ParallelJob, Schedule
from gpusim.report import StepResult
from gpusim.workload.zoo.transformer import TransformerConfig, build_transformer

Metric = Literal["tflops_per_gpu", "iteration_ms"]


@dataclass(frozen=True)
class MegatronCase:
    id: str
    system: str
    num_gpus: int
    layers: int
    hidden: int
    heads: int
    seq_len: int
    tp: int
    pp: int
    dp: int
    microbatch: int
    global_batch: int
    virtual_stages: int
    overlap_grad_reduce: bool  # ddp_impl torch (overlapped buckets) or local (after backward)
    metric: Metric
    measured: float
    vocab: int = 51200

    def flops_per_step(self) -> float:
        """The paper's model FLOPs per iteration (recompute counted)."""
        b, s, ll, h, v = self.global_batch, self.seq_len, self.layers, self.hidden, self.vocab
        return 96.0 * b * s * ll * h * h * (1 + s / (6 * h) + v / (16 * ll * h))


def _sc21(size: str, gpus: int, layers: int, hidden: int, heads: int, tp: int, pp: int,
          mb: int, batch: int, layers_per_virtual: int | None, local_ddp: bool,
          tflops: float) -> MegatronCase:
    v = layers // (pp * layers_per_virtual) if layers_per_virtual else 1
    return MegatronCase(f"megatron_sc21_tab1_{size}", "dgx-a100", gpus, layers, hidden, heads,
                        2048, tp, pp, gpus // (tp * pp), mb, batch, v, not local_ddp,
                        "tflops_per_gpu", tflops)


def _mp2020(size: str, system: str, gpus: int, layers: int, hidden: int, heads: int,
            batch: int, ms: float) -> MegatronCase:
    node = "dgx2_v100" if system == "dgx-2" else "dgxa100"
    system = "dgx-2" if system == "dgx-2" else "dgx-a100-320gb"
    return MegatronCase(f"megatron_2020_mp_{size}_{node}", system, gpus, layers, hidden, heads,
                        1024, gpus, 1, 1, batch, batch, 1, False, "iteration_ms", ms)


def _dp2020(size: str, gpus: int, layers: int, hidden: int, heads: int, tp: int,
            ms: float) -> MegatronCase:
    return MegatronCase(f"megatron_2020_dp_{size}_{gpus}gpu_dgxa100", "dgx-a100-320gb", gpus,
                        layers, hidden, heads, 1024, tp, 1, gpus // tp,
                        2048 // (gpus // tp), 2048, 1, False, "iteration_ms", ms)


CASES: tuple[MegatronCase, ...] = (
    _sc21("1.7B", 32, 24, 2304, 24, 1, 1, 16, 512, None, False, 137),
    _sc21("3.6B", 64, 30, 3072, 32, 2, 1, 16, 512, None, False, 138),
    _sc21("7.5B", 128, 36, 4096, 32, 4, 1, 16, 512, None, False, 142),
    _sc21("18B", 256, 40, 6144, 48, 8, 1, 8, 1024, None, False, 135),
    _sc21("39B", 512, 48, 8192, 64, 8, 2, 4, 1536, None, True, 138),
    _sc21("76B", 1024, 60, 10240, 80, 8, 4, 2, 1792, 5, True, 140),
    _sc21("145B", 1536, 80, 12288, 96, 8, 8, 2, 2304, 5, True, 148),
    _sc21("310B", 1920, 96, 16384, 128, 8, 16, 1, 2160, 3, True, 155),
    _sc21("530B", 2520, 105, 20480, 128, 8, 35, 1, 2520, 1, True, 163),
    _sc21("1T", 3072, 128, 25600, 160, 8, 64, 1, 3072, None, True, 163),
    _mp2020("1B", "dgx-2", 1, 24, 1920, 15, 8, 1121),
    _mp2020("1B", "dgx-a100", 1, 24, 1920, 15, 16, 1076),
    _mp2020("2B", "dgx-2", 2, 30, 2304, 18, 8, 1093),
    _mp2020("2B", "dgx-a100", 2, 30, 2304, 18, 16, 1026),
    _mp2020("4B", "dgx-2", 4, 36, 3072, 24, 8, 1238),
    _mp2020("4B", "dgx-a100", 4, 36, 3072, 24, 16, 1162),
    _mp2020("8B", "dgx-2", 8, 42, 4096, 32, 8, 1407),
    _mp2020("8B", "dgx-a100", 8, 42, 4096, 32, 16, 1343),
    _dp2020("1B", 128, 24, 1920, 15, 1, 1153),
    _dp2020("2B", 256, 30, 2304, 18, 2, 1101),
    _dp2020("4B", 512, 36, 3072, 24, 4, 1242),
    _dp2020("8B", 1024, 42, 4096, 32, 8, 1380),
)


def job_for(case: MegatronCase) -> ParallelJob:
    """The case as gpusim describes it: a GPT of the case's dimensions, Megatron-LM style."""
    cfg = TransformerConfig(name=case.id, layers=case.layers, hidden=case.hidden,
                            heads=case.heads, vocab=case.vocab, seq_len=case.seq_len,
                            max_positions=case.seq_len, dropout=True, fused_attention=False)
    schedule: Schedule = "interleaved" if case.virtual_stages > 1 else "1f1b"
    parallel = ParallelConfig(tensor=case.tp, pipeline=case.pp, data=case.dp,
                              microbatch_size=case.microbatch, schedule=schedule,
                              virtual_stages=case.virtual_stages,
                              overlap_grad_reduce=case.overlap_grad_reduce)
    return ParallelJob(build_transformer(cfg), Topology.build(case.system, case.num_gpus),
                       case.global_batch, parallel, "fp16", "adam", "full", megatron=True)


@dataclass(frozen=True)
class Prediction:
    case: MegatronCase
    predicted: float  # in the case's metric
    step: StepResult

    @property
    def error(self) -> float:
        """Relative error of the prediction against the measured figure."""
        return (self.predicted - self.case.measured) / self.case.measured


def predict(case: MegatronCase) -> Prediction:
    step = simulate_parallel_step(job_for(case), trace=False)
    if case.metric == "iteration_ms":
        value = step.step_time_s * 1e3
    else:
        value = case.flops_per_step() / step.step_time_s / case.num_gpus / 1e12
    return Prediction(case, value, step)
