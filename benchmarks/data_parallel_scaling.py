"""Predicted against published data-parallel runs: throughput, and how it scales.

Reads the multi-GPU rows of published/dev_cases.yaml, section B_single_node (NVIDIA
DeepLearningExamples: ResNet-50 on one DGX-1 or DGX A100, BERT-large pre-training on one to
32 DGX A100 nodes), predicts each as a data-parallel job on the row's DGX, and prints the
predicted and measured throughput and, per workload, the scaling efficiency against the
smallest run of the same table:

    efficiency = throughput(N GPUs) / (N / N0 x throughput(N0 GPUs))

The ratio cancels most of the per-GPU kernel error (the same kernels run at every size), so
it checks what the many-GPU model adds: the all-reduce over NVLink and InfiniBand, and how
much of it the backward pass hides. Nothing is fitted to these figures.

How the runs are taken (DeepLearningExamples' scripts of the time):
- ResNet-50: PyTorch DDP, gradients reduced in buckets during the backward pass.
- BERT-large: gradients accumulated over the per-GPU batch, then all-reduced once after the
  last backward (``--allreduce_post_accumulation``); in fp16 runs the weights are fp16 with
  fp32 master copies and the all-reduce is in fp16 (``--allreduce_post_accumulation_fp16``).
  The multi-node table keeps the global batch constant: the accumulated batch per GPU of
  the one-node run halves as the nodes double.

    python benchmarks/data_parallel_scaling.py [path/to/dev_cases.yaml]
"""

from __future__ import annotations

import re
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from dev_cases import (
    DEFAULT,
    GPUS,
    PRECISIONS,
    SYSTEMS,
    TXL_STACK,
    bert_batches,
    bert_model,
)

from gpusim.comm.topology import Topology
from gpusim.errors import GpusimError
from gpusim.estimation import replace_layers, resolve_model, simulate_parallel_step
from gpusim.hardware.catalog import load_gpu, load_system
from gpusim.plan.parallel_job import ParallelConfig, ParallelJob
from gpusim.workload.layers import Conv2d


@dataclass(frozen=True)
class Run:
    row: dict[str, Any]
    group: tuple[str, ...]  # rows of one workload and table, differing only in GPU count
    gpus: int
    predicted: float | None
    why: str = ""

    @property
    def measured(self) -> float:
        return float(self.row["value"])


def _batch(row: dict[str, Any]) -> int:
    """The per-GPU batch; the multi-node table gives one per precision, '126 (TF32) / 256
    (FP16)'."""
    text = str(row["parallelism"]["batch_per_gpu"])
    if text.isdigit():
        return int(text)
    precision = row["parallelism"]["precision"].split()[0]
    found = re.search(rf"(\d+)\s*\({precision}\)", text)
    if found is None:
        raise ValueError(f"no {precision} batch in {text!r}")
    return int(found.group(1))


def _accumulated(row: dict[str, Any], rows: list[dict[str, Any]]) -> int | None:
    """Accumulated batch per GPU; a multi-node row takes the one-node (8 GPU) row's, over
    its node count."""
    par = row["parallelism"]
    if par.get("accumulated_batch_per_gpu"):
        return int(par["accumulated_batch_per_gpu"])
    if "global_batch_note" not in par:
        return None
    seq, precision = row["model"].get("seq_len"), par["precision"]
    one_node = next((r for r in rows if r["num_gpus"] == 8 and r["model"]["name"] ==
                     row["model"]["name"] and r["model"].get("seq_len") == seq and
                     r["parallelism"]["precision"] == precision and
                     r["parallelism"].get("accumulated_batch_per_gpu")), None)
    if one_node is None:
        return None
    return int(one_node["parallelism"]["accumulated_batch_per_gpu"]) // (row["num_gpus"] // 8)


def _predict(row: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[float | None, str]:
    """Predicted samples/s of a row, or None and why not. One GPU runs the same recipe as
    many (for BERT fp16, fp16 weights rather than benchmarks/dev_cases.py's autocast), so
    the scaling ratios compare like with like."""
    n = int(row["num_gpus"])
    gpu = next((v for k, v in GPUS.items() if k in row["hardware"]), None)
    system = next((v for k, v in SYSTEMS.items() if k in row["hardware"]), None)
    name = row["model"]["name"]
    if gpu is None or system is None:
        return None, f"no profile for {row['hardware']}"
    precision = PRECISIONS[row["parallelism"]["precision"]]
    stated = bert_batches(row) if name == "BERT-large" else None
    if stated is None and row["parallelism"].get("batch_per_gpu") is None:
        return None, "batch per GPU not stated unambiguously"
    try:
        micro = stated[0] if stated else _batch(row)
    except ValueError as exc:
        return None, str(exc)
    if name.startswith("ResNet-50"):
        model, per_gpu, post_accumulation = resolve_model("resnet50"), micro, False
        if str(row["parallelism"].get("memory_format") or "").startswith("nhwc"):
            # DLE's AMP recipes train channels-last (--memory-format nhwc)
            model = replace_layers(model, lambda la: replace(la, channels_last=True)
                                   if isinstance(la, Conv2d) else la)
    elif name == "BERT-large":
        bert, why = bert_model(row)
        if bert is None:
            return None, why
        model = bert
        per_gpu = _accumulated(row, rows) or (stated[1] if stated else micro)
        post_accumulation = True
        if per_gpu % micro:
            return None, f"batch {micro} does not divide the accumulated {per_gpu} per GPU"
    elif name == "Transformer-XL base (WT103)":
        # run_wt103_base.sh train <GPUs> --config trainbench --local_batch_size <LBS>
        # [--fp16] (README @729963dd4): DDP reducing gradient buckets during backward, no
        # accumulation; --fp16 is apex amp O2: fp16 weights and gradients, fp32 master
        # copies (what ``megatron`` selects). Throughput in tokens/s, as the table prints it.
        txl = resolve_model("transformer-xl-base")
        topology = Topology.build(load_system(system), n, load_gpu(gpu))
        try:
            job = ParallelJob(txl, topology, micro * n,
                              ParallelConfig(data=n, microbatch_size=micro),
                              precision, megatron=precision == "fp16",  # type: ignore[arg-type]
                              stack=TXL_STACK)
            return simulate_parallel_step(job, trace=False).tokens_per_s, ""
        except GpusimError as exc:
            return None, f"infeasible: {exc}"
    else:
        return None, f"{name} is not in the zoo"
    topology = Topology.build(load_system(system), n, load_gpu(gpu))
    config = ParallelConfig(data=n, microbatch_size=micro,
                            overlap_grad_reduce=not post_accumulation)
    # fp16 BERT: fp16 weights, fp32 masters, fp16 gradients (what ``megatron`` selects)
    fp16_weights = post_accumulation and precision == "fp16"
    try:
        job = ParallelJob(model, topology, per_gpu * n, config, precision,  # type: ignore[arg-type]
                          megatron=fp16_weights)
        return simulate_parallel_step(job, trace=False).samples_per_s, ""
    except GpusimError as exc:
        return None, f"infeasible: {exc}"


def _group(row: dict[str, Any]) -> tuple[str, ...]:
    table = "multi-node" if "global_batch_note" in row["parallelism"] else "one node"
    gpu = next((v for k, v in GPUS.items() if k in row["hardware"]), row["hardware"])
    return (row["model"]["name"], str(row["model"].get("seq_len") or ""),
            row["parallelism"]["precision"], gpu, table if row["num_gpus"] > 1 else "")


@dataclass(frozen=True)
class Scaled:
    run: Run
    error: float | None  # of the throughput
    efficiency: tuple[float, float] | None  # predicted and measured scaling efficiency


def evaluate(rows: list[dict[str, Any]]) -> list[list[Scaled]]:
    """Every multi-GPU workload of ``rows`` in order of GPU count, its base run first."""
    runs = [Run(r, _group(r), int(r["num_gpus"]), *_predict(r, rows)) for r in rows]
    groups: dict[tuple[str, ...], list[Run]] = {}
    for run in runs:
        if run.gpus > 1:
            groups.setdefault(run.group, []).append(run)
    tables = []
    for key, members in groups.items():
        if key[-1] == "one node":  # its base is the one-GPU row
            members += [r for r in runs if r.gpus == 1 and r.group[:-1] == key[:-1]]
        members.sort(key=lambda r: r.gpus)
        base = members[0]
        table = []
        for run in members:
            error = efficiency = None
            if run.predicted is not None:
                error = (run.predicted - run.measured) / run.measured
                if run is not base and base.predicted is not None:
                    factor = run.gpus / base.gpus
                    efficiency = (run.predicted / (factor * base.predicted),
                                  run.measured / (factor * base.measured))
            table.append(Scaled(run, error, efficiency))
        tables.append(table)
    return tables


def main(path: Path = DEFAULT) -> None:
    if not path.is_file():
        sys.exit(f"dev_cases.yaml not found at {path}; pass its path")
    tables = evaluate(yaml.safe_load(path.read_text())["B_single_node"])
    print(f"{'case':50s} {'GPUs':>5s} {'pred':>9s} {'meas':>9s} {'error':>8s}  "
          f"{'scaling pred':>12s} {'meas':>6s}")
    errors, gaps = [], []
    for table in tables:
        for s in table:
            run = s.run
            if run.predicted is None or s.error is None:
                print(f"{run.row['id']:50s} {run.gpus:5d} skipped: {run.why}")
                continue
            if run.gpus > 1:
                errors.append(abs(s.error))
            scaling = ""
            if s.efficiency is not None:
                pred, meas = s.efficiency
                gaps.append(abs(pred - meas))
                scaling = f"{100 * pred:11.1f}% {100 * meas:5.1f}%"
            print(f"{run.row['id']:50s} {run.gpus:5d} {run.predicted:9.1f} {run.measured:9.1f} "
                  f"{100 * s.error:+7.1f}%  {scaling}")
        print()
    if errors:
        print(f"{len(errors)} multi-GPU runs: throughput MAPE {100 * statistics.mean(errors):.1f}%"
              f", max {100 * max(errors):.1f}%")
    if gaps:
        print(f"{len(gaps)} scaling efficiencies: mean absolute difference "
              f"{100 * statistics.mean(gaps):.1f} points, max {100 * max(gaps):.1f} points")
    print("Scaling is against the smallest run of the same table (one GPU, or one node of 8 "
          "for the multi-node table); calibration: stated defaults, not fitted.")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
