"""Published BERT-base forward passes against gpusim's forward kernels.

NVIDIA FasterTransformer's bert_guide.md times Hugging Face's BertEncoder (12 layers, hidden
768, 12 heads; no embeddings, no pooler) traced with TorchScript, in inference, on an A100,
an A10, a T4 and a V100 (rows collected in measurements/published/a100-80gb/
eager_kernels_candidates.yaml, section forward_passes, with their source). gpusim's side is
the device time of its BERT-base forward kernels for the same layers, dropout left out (the
model runs in eval mode). Inference is never fitted: this checks the forward kernels apart
from the backward pass, the optimizer and the host. One difference in the workload: the zoo's
BERT projects Q, K and V with one product, where Hugging Face's BertSelfAttention runs three
(query, key and value Linear layers); the products' work is the same. Sizes below 3072
tokens a call sit at TorchScript's host floor (about 4 ms on the A100 whatever the size)
and are shown, not compared.

    python benchmarks/forward_passes.py
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from gpusim.estimation import build_job
from gpusim.plan.lower import lower
from gpusim.workload.zoo.transformer import TRANSFORMERS, build_transformer

ROWS = (Path(__file__).resolve().parents[1] / "measurements" / "published" / "a100-80gb"
        / "eager_kernels_candidates.yaml")
# The source's GPUs as catalog profiles: the A100's 1593 MHz memory clock is the 80 GB
# card's HBM2e; the V100 sits in a DGX-1 (16 or 32 GB: the same chip and memory rate).
GPUS = {"A100": "a100-80gb", "A10": "a10", "T4": "t4", "V100": "v100-sxm2-16gb"}
MIN_TOKENS = 3072  # smaller calls run at the host's pace


def gpu_of(row: dict[str, Any]) -> str:
    return GPUS[str(row["gpu"]).split()[0]]


def predicted_ms(row: dict[str, Any]) -> float:
    """Device time of the encoder layers' forward kernels, dropout left out. FP16 rows run a
    model held in fp16 (.half()): no autocast copies of its weights."""
    shape = row["shape"]
    cfg = TRANSFORMERS["bert-base"].model_copy(update={"scale_and_mask": True})
    job = build_job(build_transformer(cfg, shape["seq"]), gpu_of(row), shape["batch"],
                    precision=row["dtype"], loader_workers=0)[0]
    if row["dtype"] == "fp16":
        job = replace(job, master_weights=True)
    kernels = [k for k in lower(job).microbatch if k.phase == "forward"
               and k.name.startswith("h.") and "dropout" not in k.name]
    return 1e3 * sum(k.device_s for k in kernels)


def main() -> None:
    rows = yaml.safe_load(ROWS.read_text())["forward_passes"]
    groups: dict[tuple[str, str], list[float]] = {}
    print(f"{'gpu':16s} {'precision':9s} {'batch':>5s} {'seq':>4s} {'measured':>9s} "
          f"{'predicted':>9s} {'error':>7s}")
    for row in rows:
        shape = row["shape"]
        pred = predicted_ms(row)
        error = pred / row["value"] - 1
        paced = shape["batch"] * shape["seq"] >= MIN_TOKENS
        if paced:
            groups.setdefault((gpu_of(row), row["dtype"]), []).append(error)
        print(f"{gpu_of(row):16s} {row['dtype']:9s} {shape['batch']:5d} {shape['seq']:4d} "
              f"{row['value']:7.2f}ms {pred:7.2f}ms {100 * error:+6.1f}%"
              + ("" if paced else "  (host floor: not compared)"))
    print("\nDevice-paced sizes (error: predicted forward time over measured, minus 1):")
    for (gpu, precision), errors in sorted(groups.items()):
        print(f"  {gpu:16s} {precision:5s} {len(errors)} sizes, mean {statistics.mean(errors):+.1%}"
              f", from {min(errors):+.1%} to {max(errors):+.1%}")


if __name__ == "__main__":
    main()
