"""Published microbenchmarks as micro-suite files: measurements/published/<device>/micro.json.

Each device's ``transcribed.yaml`` holds figures as their sources printed them (a GEMM's
TFLOP/s, an attention kernel's TFLOP/s under the FlashAttention papers' FLOP count, a
bandwidth in GB/s), every row naming its source. This module turns each row into a micro
case of the project's own schema, its time worked out from the printed figure, so that
``gpusim calibrate`` fits a GPU nobody here has measured exactly as it fits one that was.

The sources timed kernels on the device alone (CUDA events around hot loops of large
kernels), so every case is marked ``timed: kernel``: its prediction is the kernels' time
without the host's. A row the model has no case for (FlashAttention-3, Triton kernels,
instruction-level throughput) stays in the transcription and is listed as not converted.

    python -m gpusim.measure.published measurements/published/a100-80gb/transcribed.yaml
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpusim.errors import InvalidMeasurement
from gpusim.hardware.catalog import read_yaml
from gpusim.measure import results

# Backends whose kernels gpusim models, by the names the micro suite gives SDPA's backends.
SDPA_BACKENDS = ("flash", "efficient", "cudnn")
# Passes over each array a bandwidth kernel makes (reads, writes), as BabelStream counts them,
# and the micro-suite elementwise op that makes the same passes.
MEMORY_OPS = {"copy": ("copy", 2), "scale": ("copy", 2), "mul": ("copy", 2),
              "add": ("add", 3), "triad": ("add", 3), "read": ("sum", 1), "dot": ("add", 2)}
DTYPES = {"fp64": 8, "fp32": 4, "bf16": 2, "fp16": 2}
# FlashAttention papers' FLOP count: forward 4 * batch * heads * seq^2 * head_dim (half of it
# when causal); the backward is 2.5 forwards (its five products to the forward's two).
PASS_FORWARDS = {"forward": 1.0, "backward": 2.5, "forward_backward": 3.5}


@dataclass(frozen=True)
class Skipped:
    row: dict[str, Any]
    why: str


def attention_flops(row: dict[str, Any]) -> float:
    forward = 4.0 * row["batch"] * row["heads"] * row["seq"] ** 2 * row["head_dim"]
    return forward / (2 if row["causal"] else 1) * PASS_FORWARDS[row["pass"]]


def _case(row: dict[str, Any]) -> dict[str, Any] | str:
    """The micro case of one transcribed row, or why it has none."""
    kind, src = row.get("kind"), row["source"]
    base = {"source": src, "timed": "kernel", "repeats": None, "inner": None}
    if row.get("note", "").startswith("instruction-level"):
        return "instruction-level throughput, not a library kernel"
    if kind == "gemm":
        layout = row.get("layout", "nn")
        if layout != "nn":
            return f"GEMM layout {layout} (the micro suite's GEMMs are nn)"
        m, n, k, p = row["m"], row["n"], row["k"], row["precision"]
        seconds = 2.0 * m * n * k / (row["tflops"] * 1e12)
        return {"id": f"published/{src}/gemm/{p}/{m}x{n}x{k}", "kind": "gemm", "precision": p,
                "m": m, "n": n, "k": k, **base, "median_s": seconds}
    if kind == "sdpa":
        if row["backend"] not in SDPA_BACKENDS:
            return f"attention backend {row['backend']} is not a kernel gpusim models"
        shape = (f"{row['batch']}x{row['heads']}x{row.get('kv_heads', row['heads'])}x"
                 f"{row['seq']}x{row['head_dim']}{'c' if row['causal'] else ''}")
        return {"id": f"published/{src}/sdpa/{row['backend']}/{shape}/{row['pass']}",
                "kind": "sdpa", "precision": row["precision"], "backend": row["backend"],
                "batch": row["batch"], "heads": row["heads"],
                "kv_heads": row.get("kv_heads", row["heads"]), "seq": row["seq"],
                "head_dim": row["head_dim"], "causal": row["causal"], "pass": row["pass"],
                **base, "median_s": attention_flops(row) / (row["tflops"] * 1e12)}
    if kind == "memory":
        if row["op"] not in MEMORY_OPS or row.get("dtype") not in DTYPES:
            return f"bandwidth op {row['op']} on {row.get('dtype')} has no micro case"
        op, arrays = MEMORY_OPS[row["op"]]
        size = row["bytes_per_array"]
        return {"id": f"published/{src}/elementwise/{row['op']}/{size}", "kind": "elementwise",
                "op": op, "bytes": size, "dtype": row["dtype"], **base,
                "median_s": arrays * size / (row["gb_s"] * 1e9)}
    if kind == "host_copy":
        return {"id": f"published/{src}/copy/{row['direction']}/"
                      f"{'pinned' if row['pinned'] else 'pageable'}/{row['bytes']}",
                "kind": "host_copy", "direction": row["direction"], "pinned": row["pinned"],
                "bytes": row["bytes"], **base, "median_s": row["bytes"] / (row["gb_s"] * 1e9)}
    return f"no micro case of kind {kind!r}"


def convert(transcribed: dict[str, Any], origin: str) -> tuple[dict[str, Any], list[Skipped]]:
    """(micro-suite data, rows not converted and why) of one device's transcription."""
    sources = {s["id"]: s for s in transcribed.get("sources", [])}
    cases, skipped = [], []
    for row in transcribed.get("rows", []):
        if row.get("source") not in sources:
            raise InvalidMeasurement(f"{origin}: a row cites {row.get('source')!r}, which is "
                                     "not among its sources")
        case = _case(row)
        if isinstance(case, str):
            skipped.append(Skipped(row, case))
        else:
            cases.append(case)
    data = {
        "schema_version": results.SCHEMA_VERSION, "suite": "micro",
        "device": transcribed["device"], "quick": False,
        "provenance": {"date": str(transcribed.get("collected", "")),
                       "published": True, "transcribed_from": origin,
                       "command": f"python -m gpusim.measure.published {origin}",
                       "hardware_as_stated": transcribed.get("hardware_as_stated", ""),
                       "sources": list(sources.values())},
        "switches": {},
        "cases": cases,
    }
    if "sdpa_auto_backend" in transcribed:
        data["sdpa_auto_backend"] = transcribed["sdpa_auto_backend"]
    return data, skipped


def write_beside(path: str | Path) -> tuple[Path, list[Skipped]]:
    """Convert ``path`` (a transcribed.yaml) and write micro.json beside it."""
    path = Path(path)
    data, skipped = convert(read_yaml(path), results.display_path(path))
    return results.write(path.with_name("micro.json"), data), skipped


def main(argv: list[str]) -> int:
    for arg in argv:
        out, skipped = write_beside(arg)
        print(f"wrote {results.display_path(out)}")
        for s in skipped:
            print(f"  not converted ({s.why}): {s.row.get('kind')} from {s.row.get('source')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
