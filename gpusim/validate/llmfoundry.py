"""llm-foundry's MPT benchmark tables (published/llmfoundry_tables.yaml), predicted row by row.

MosaicML published 216 measured runs of its MPT models (125M to 70B parameters, sequences of
512 to 65,536 tokens, 8 to 512 GPUs) on H100 80GB and A100 80GB/40GB, all under FSDP with the
same software: a broad, uniform check of one stack across sizes, lengths and GPU counts.
Validation only: nothing here is fitted.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpusim.data import data_dir
from gpusim.errors import GpusimError
from gpusim.estimation import estimate
from gpusim.validate.published_throughput import model_of
from gpusim.workload.model import Model

TABLES_FILE = data_dir("published") / "llmfoundry_tables.yaml"
GPUS = {"h100_80gb": "h100-sxm", "a100_80gb": "a100-80gb", "a100_40gb": "a100-40gb"}
STACK = "llm-foundry-2023"


@dataclass(frozen=True)
class TableRow:
    """One row of a table, in the columns the data file keeps."""

    table: str
    model: str
    seq_len: int
    gpus: int
    gpu: str
    mfu: float  # percent, as printed
    micro_batch: int
    grad_accum: int
    global_batch: int
    tokens_per_s_per_gpu: int
    precision: str
    mp_mode: str
    sharding: str
    activation_checkpointing: bool
    activation_cpu_offload: bool
    num_params: int

    @property
    def id(self) -> str:
        return f"mpt-{self.model} {self.gpu} x{self.gpus} s{self.seq_len} {self.precision}" \
               f" mbs{self.micro_batch}"


@dataclass(frozen=True)
class Predicted:
    row: TableRow
    predicted: float | None  # tokens/s per GPU
    flags: tuple[str, ...]  # what the prediction assumes beyond the row
    skipped: str = ""

    @property
    def error(self) -> float | None:
        return None if self.predicted is None else \
            self.predicted / self.row.tokens_per_s_per_gpu - 1


def load_tables(path: Path = TABLES_FILE) -> tuple[list[TableRow], dict[str, Any]]:
    """Every row of every table, and the MPT dimensions by model column."""
    data = yaml.safe_load(path.read_text())
    columns = data["columns"]
    rows = [TableRow(table["table"], **dict(zip(columns, values, strict=True)))
            for table in data["tables"] for values in table["rows"]]
    return rows, data["models"]


def mpt(size: str, seq_len: int, models: dict[str, Any]) -> Model:
    """MPT as llm-foundry's yamls define it: GELU MLP 4x wide, LayerNorm, biases, a learned
    position table of seq_len rows, the logits on the token embedding, vocabulary 50,368."""
    d = models[size]
    return model_of({"name": f"mpt-{size}", **d, "ffn_hidden": 4 * d["hidden"], "vocab": 50368,
                     "tied_embeddings": True, "gated_mlp": False, "norm": "layernorm"}, seq_len)


def job_of(row: TableRow, models: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """estimate() keywords for a row, and what they assume beyond it."""
    flags: list[str] = []
    fp8 = "fp8" in row.precision
    kwargs = {
        "model": mpt(row.model, row.seq_len, models), "gpu": GPUS[row.gpu],
        "batch_size": row.global_batch, "microbatch_size": row.micro_batch,
        "precision": "fp8" if fp8 else "bf16", "seq_len": row.seq_len, "num_gpus": row.gpus,
        "optimizer": "adamw", "checkpointing": "full" if row.activation_checkpointing else "none",
        "stack": STACK, "fp8_recipe": "delayed", "zero": 3,
        # Composer's FSDP mixed precision PURE reduces in the 16-bit type (reduce_dtype =
        # precision; DEFAULT's is fp32): composer/trainer/mosaic_fsdp.py, get_mixed_precision
        "bf16_grads": row.mp_mode == "PURE",
    }
    return kwargs, tuple(flags)


def predict(row: TableRow, models: dict[str, Any]) -> Predicted:
    kwargs, flags = job_of(row, models)
    try:
        step = estimate(**kwargs).step
    except GpusimError as exc:
        return Predicted(row, None, flags, exc.summary)
    return Predicted(row, (step.tokens_per_s or 0.0) / row.gpus, flags)


def predict_all(path: Path = TABLES_FILE) -> list[Predicted]:
    rows, models = load_tables(path)
    return [predict(r, models) for r in rows]


def summary(results: list[Predicted]) -> dict[str, float]:
    """Rows predicted, their mean absolute and mean signed error, and how many within 10%
    and 15%."""
    errors = [r.error for r in results if r.error is not None]
    if not errors:
        return {"cases": 0}
    return {"cases": len(errors), "mape": statistics.fmean(abs(e) for e in errors),
            "mean_signed": statistics.fmean(errors),
            "within_10": sum(abs(e) <= 0.10 for e in errors),
            "within_15": sum(abs(e) <= 0.15 for e in errors)}
