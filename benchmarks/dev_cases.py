"""Predicted against published single-GPU training throughput (NVIDIA DeepLearningExamples).

Reads the single-GPU rows of published/dev_cases.yaml, predicts
each with gpusim, and prints predicted, measured and the relative error, then the MAPE. These
rows are a first check, never fitted: the calibration files say what they were built from.

    python benchmarks/dev_cases.py [path/to/dev_cases.yaml]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

from gpusim.errors import GpusimError
from gpusim.estimate import estimate
from gpusim.hardware.calibration import calibration_for
from gpusim.hardware.catalog import load_gpu

DEFAULT = Path(__file__).resolve().parents[1] / "published" / "dev_cases.yaml"
GPUS = {"A100 80GB": "a100-80gb", "A100 40GB": "a100-40gb", "V100 16GB": "v100-sxm2-16gb",
        "V100 32GB": "v100-sxm2-32gb"}
SYSTEMS = {"DGX A100": "dgx-a100", "DGX-1": "dgx-1"}  # hardware text -> system profile
PRECISIONS = {"TF32": "tf32", "AMP": "fp16", "FP16": "fp16", "FP16 mixed": "fp16", "FP32": "fp32"}
SQUAD_SEQ_LEN = 384  # DeepLearningExamples run_squad.sh default max_seq_length


def _case(row: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """gpusim arguments for a row, or None and why it is skipped."""
    gpu = next((v for k, v in GPUS.items() if k in row["hardware"]), None)
    model = row["model"]["name"]
    par = row["parallelism"]
    if gpu is None:
        return None, f"no profile mapping for {row['hardware']}"
    if par.get("batch_per_gpu") is None:
        return None, "batch per GPU not stated unambiguously"
    args: dict[str, Any] = {"gpu": gpu, "precision": PRECISIONS[par["precision"]],
                            "loader_workers": 0, "steps": 1}
    micro = int(par["batch_per_gpu"])
    if model.startswith("ResNet-50"):
        # DLE's AMP recipes train channels-last (--memory-format nhwc), the others NCHW.
        args.update(model="resnet50", batch_size=micro,
                    channels_last=str(par.get("memory_format") or "").startswith("nhwc"))
    elif model == "BERT-large":
        total = int(par.get("accumulated_batch_per_gpu") or micro)
        seq = row["model"].get("seq_len") or (SQUAD_SEQ_LEN if "squad" in row["id"] else None)
        args.update(model="bert-large", batch_size=total, grad_accum=total // micro,
                    seq_len=seq)
        if "squad" in row["id"]:
            return None, "SQuAD fine-tuning head not in the zoo (pre-training head differs)"
    else:
        return None, f"{model} is not in the zoo"
    return args, ""


def main(path: Path = DEFAULT) -> None:
    if not path.is_file():
        sys.exit(f"dev_cases.yaml not found at {path}; pass its path")
    rows = [r for r in yaml.safe_load(path.read_text())["B_single_node"] if r["num_gpus"] == 1]
    errors = []
    print(f"{'case':50s} {'gpu':16s} {'pred':>9s} {'meas':>9s} {'error':>8s}  unit")
    for row in rows:
        args, why = _case(row)
        if args is None:
            print(f"{row['id']:50s} skipped: {why}")
            continue
        try:
            result = estimate(**args)
        except GpusimError as exc:
            print(f"{row['id']:50s} {args['gpu']:16s} infeasible: {exc}")
            continue
        predicted = result.step.samples_per_s
        error = (predicted - row["value"]) / row["value"]
        errors.append(abs(error))
        print(f"{row['id']:50s} {args['gpu']:16s} {predicted:9.1f} {row['value']:9.1f} "
              f"{100 * error:+7.1f}%  {row['unit']}")
    if errors:
        print(f"\n{len(errors)} cases: MAPE {100 * statistics.mean(errors):.1f}%, "
              f"max {100 * max(errors):.1f}%")
    used = sorted({f"{g}: {calibration_for(load_gpu(g)).name}" for g in GPUS.values()})
    print("Input pipeline not simulated (DeepLearningExamples decodes with DALI). "
          f"Calibrations: {'; '.join(used)}.")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
