"""Published microbenchmarks as micro-suite files: measurements/published/<device>/micro.json.

Each device's ``transcribed.yaml`` holds figures as their sources printed them (a GEMM's
TFLOP/s, an attention kernel's TFLOP/s under the FlashAttention papers' FLOP count, a
bandwidth in GB/s), every row naming its source. This module turns each row into a micro
case of the project's own schema, its time worked out from the printed figure, so that
``gpusim calibrate`` fits a GPU nobody here has measured exactly as it fits one that was.

The sources timed kernels on the device alone (CUDA events around hot loops of large
kernels), so every case is marked ``timed: kernel``: its prediction is the kernels' time
without the host's. A source that reports the best of a shape search (``search_maximum``)
gives cases marked ``fit: false``: a maximum is biased above typical products, so they check
the model and are not fitted. A row the model has no case for (FlashAttention-3, Triton kernels,
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

# Attention kernels gpusim models, by the names the micro suite gives SDPA's backends
# (and "triton": FlashAttention's own Triton kernel, which no SDPA backend runs; "unfused":
# attention written out in PyTorch, the FlashAttention benchmarks' "Pytorch" baseline).
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "triton", "unfused")
# Each bandwidth kernel (as BabelStream and STREAM name them) as the micro-suite elementwise
# op that makes the same passes: (op, arrays it reads, the op's operand in arrays). Bytes
# moved are every array read plus every array written, once each.
MEMORY_OPS = {"copy": ("copy", 2, 1), "scale": ("copy", 2, 1), "mul": ("copy", 2, 1),
              "add": ("add", 3, 1), "triad": ("add", 3, 1), "read": ("sum", 1, 1),
              "dot": ("sum", 2, 2)}  # a sum over both arrays at once
DTYPES = {"fp64": 8, "fp32": 4, "bf16": 2, "fp16": 2}
# FlashAttention papers' FLOP count: forward 4 * batch * heads * seq^2 * head_dim (half of it
# when causal); the backward is 2.5 forwards (its five products to the forward's two).
PASS_FORWARDS = {"forward": 1.0, "backward": 2.5, "forward_backward": 3.5}


# Row kernels (measurements/published/row-kernels.yaml, several GPUs in one file): the GPUs
# as their sources name them, and each PyTorch implementation as the micro suite's row
# kernel that runs the same ops: (op, the zoo layer's upcast).
ROW_KERNELS_FILE = "row-kernels.yaml"
# Published convolution layers, shared by devices, and the profile each source's GPU is:
# DeepBench's "NVIDIA V100" in a DGX-1 (memory size not stated) is filed with its other V100
# figures, under the 16 GB profile.
CONVS_FILE = "conv_rows.yaml"
CONV_GPUS = {"v100-sxm2": "v100-sxm2-16gb"}
ROW_KERNEL_GPUS = {"NVIDIA A100-SXM4-80GB": "a100-80gb", "NVIDIA A100-SXM4-40GB": "a100-40gb",
                   "NVIDIA H100 80GB HBM3": "h100-sxm"}
ROW_KERNEL_IMPLS = {("layer_norm", "torch.nn.LayerNorm"): ("layer_norm", ""),
                    ("rms_norm", "torch.nn.RMSNorm"): ("rms_norm", ""),
                    ("rms_norm", "HF LlamaRMSNorm"): ("rms_norm", "fp32_weight"),
                    ("swiglu", "eager y1, y2 = torch.chunk"): ("silu_mul", "")}
ROW_KERNEL_PASSES = {"forward": "forward", "backward": "backward", "full": "forward_backward"}
# triton's do_bench times each call alone: below this the host's launch shows in the time.
ROW_KERNEL_MIN_S = 1e-4


@dataclass(frozen=True)
class Skipped:
    row: dict[str, Any]
    why: str


def attention_flops(row: dict[str, Any]) -> float:
    forward = 4.0 * row["batch"] * row["heads"] * row["seq"] ** 2 * row["head_dim"]
    return forward / (2 if row["causal"] else 1) * PASS_FORWARDS[row["pass"]]


# A column-major GEMM (cuBLAS's own convention) C = op(A) op(B) of m x n is, in memory, the
# row-major n x m product op(B)^T op(A)^T: the operands and their transposes trade places.
COLUMN_MAJOR_LAYOUTS = {"nn": "nn", "nt": "tn", "tn": "nt", "tt": "tt"}


def _case(row: dict[str, Any], source: dict[str, Any]) -> dict[str, Any] | str:
    """The micro case of one transcribed row, or why it has none."""
    kind, src = row.get("kind"), row["source"]
    base: dict[str, Any] = {"source": src, "timed": "kernel", "repeats": None, "inner": None}
    if source.get("search_maximum"):
        # The fastest of many shapes tried: above what typical products reach, so a check
        # on the model rather than a figure to fit it to.
        base["fit"] = False
    if row.get("skip"):
        return str(row["skip"])
    if source.get("superseded_by"):
        return f"a superseded table (see {source['superseded_by']})"
    if row.get("note", "").startswith("instruction-level"):
        return "instruction-level throughput, not a library kernel"
    if kind == "gemm":
        m, n, k, p = row["m"], row["n"], row["k"], row["precision"]
        layout = row.get("layout", "nn")
        if source.get("gemm_storage") == "column-major":
            m, n, layout = n, m, COLUMN_MAJOR_LAYOUTS[layout]
        if layout not in ("nn", "nt", "tn"):
            return f"GEMM layout {layout} (training runs nn, nt and tn)"
        seconds = 2.0 * m * n * k / (row["tflops"] * 1e12)
        return {"id": f"published/{src}/gemm/{p}/{m}x{n}x{k}/{layout}", "kind": "gemm",
                "precision": p, "m": m, "n": n, "k": k, "layout": layout, **base,
                "median_s": seconds}
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
                **base, "median_s": (row["ms"] / 1e3 if "ms" in row
                                     else attention_flops(row) / (row["tflops"] * 1e12))}
    if kind == "memory":
        if row["op"] not in MEMORY_OPS or row.get("dtype") not in DTYPES:
            return f"bandwidth op {row['op']} on {row.get('dtype')} has no micro case"
        op, arrays, operand = MEMORY_OPS[row["op"]]
        size = row["bytes_per_array"]
        return {"id": f"published/{src}/elementwise/{row['op']}/{size}", "kind": "elementwise",
                "op": op, "bytes": operand * size, "dtype": row["dtype"], **base,
                "median_s": arrays * size / (row["gb_s"] * 1e9)}
    if kind == "host_copy":
        return {"id": f"published/{src}/copy/{row['direction']}/"
                      f"{'pinned' if row['pinned'] else 'pageable'}/{row['bytes']}",
                "kind": "host_copy", "direction": row["direction"], "pinned": row["pinned"],
                "bytes": row["bytes"], **base, "median_s": row["bytes"] / (row["gb_s"] * 1e9)}
    return f"no micro case of kind {kind!r}"


def _conv_case(row: dict[str, Any]) -> dict[str, Any] | str:
    """The micro case of one published convolution layer, or why it has none."""
    if row["precision"] == "fp32":
        return ("its source ran these 'fp32' convolutions on tensor cores (faster than the "
                "fp32 peak): neither fp32 nor tf32 data")
    if row["r"] != row["s"] or row.get("groups", 1) != 1 or row.get("dilation", 1) != 1:
        return "a non-square, grouped or dilated filter (gpusim's convolution is square)"
    if not isinstance(row["stride"], int) or not isinstance(row["pad"], int):
        return "different strides or padding across height and width"
    if "pads C and K" in row.get("note", ""):
        return "its channels were padded to a multiple of 8 before timing"
    shape = (f"{row['n']}x{row['c']}x{row['h']}x{row['w']}x{row['k']}x{row['r']}"
             f"s{row['stride']}p{row['pad']}")
    return {"id": f"published/{row['source']}/conv/{row['precision']}/{row['layout']}/{shape}/"
                  f"{row['pass']}",
            "kind": "conv", "precision": row["precision"], "batch": row["n"],
            "in_channels": row["c"], "out_channels": row["k"], "kernel": row["r"],
            "height": row["h"], "width": row["w"], "stride": row["stride"],
            "padding": row["pad"], "bias": 0, "layout": row["layout"], "pass": row["pass"],
            "source": row["source"], "timed": "kernel", "repeats": None, "inner": None,
            "median_s": row["value"] / 1e3 if row["unit"] == "ms" else row["value"]}


def _row_kernel_case(row: dict[str, Any]) -> dict[str, Any] | str:
    impl = next((v for (op, prefix), v in ROW_KERNEL_IMPLS.items()
                 if row["op"] == op and row["impl"].startswith(prefix)), None)
    if impl is None:
        return f"{row['op']} as {row['impl'][:40]!r} is no micro-suite row kernel"
    if row.get("published_mode") or row["pass"] not in ROW_KERNEL_PASSES:
        return "its backward mode re-runs the forward"
    seconds = row["ms"] / 1e3
    if seconds < ROW_KERNEL_MIN_S:
        return "under 0.1 ms, where timing each call alone includes the host's launch"
    op, upcast = impl
    precision = "fp32" if row["dtype"] == "fp32" else "bf16"
    phase = ROW_KERNEL_PASSES[row["pass"]]
    return {"id": f"published/{row['source']}/kernel/{op}{'-' + upcast if upcast else ''}/"
                  f"{precision}/{row['rows']}x{row['cols']}/{phase}",
            "kind": "row_kernel", "op": op, "upcast": upcast, "rows": row["rows"],
            "cols": row["cols"], "precision": precision, "pass": phase,
            "source": row["source"], "timed": "kernel", "repeats": None, "inner": None,
            "median_s": seconds}


def row_kernel_rows(device: str, row_kernels: dict[str, Any]
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(sources, rows) of the row-kernel file that ran on ``device``."""
    rows = [r for r in row_kernels.get("rows", []) if ROW_KERNEL_GPUS.get(r["gpu"]) == device]
    cited = {r["source"] for r in rows}
    return [s for s in row_kernels.get("sources", []) if s["id"] in cited], rows


def shared_rows(device: str, shared: dict[str, Any], devices: dict[str, str]
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(sources, rows) of a shared file whose rows ran on ``device`` (``devices`` maps the
    file's device names to profiles)."""
    rows = [r for r in shared.get("rows", []) if devices.get(r["device"]) == device]
    cited = {r["source"] for r in rows}
    return [s for s in shared.get("sources", []) if s["id"] in cited], rows


def convert(transcribed: dict[str, Any], origin: str,
            row_kernels: dict[str, Any] | None = None, convs: dict[str, Any] | None = None
            ) -> tuple[dict[str, Any], list[Skipped]]:
    """(micro-suite data, rows not converted and why) of one device's transcription, with
    the rows of ``row_kernels`` and ``convs`` (the shared row-kernel and convolution files)
    that ran on the same device."""
    sources = {s["id"]: s for s in transcribed.get("sources", [])}
    cases, skipped = [], []
    extra_sources, extra_rows = row_kernel_rows(transcribed["device"], row_kernels or {})
    conv_sources, conv_rows = shared_rows(transcribed["device"], convs or {}, CONV_GPUS)
    extra_sources += conv_sources
    for row in [*extra_rows, *conv_rows]:
        case = _conv_case(row) if "pass" in row and "r" in row else _row_kernel_case(row)
        if isinstance(case, str):
            skipped.append(Skipped(row, case))
        else:
            cases.append(case)
    for row in transcribed.get("rows", []):
        if row.get("source") not in sources:
            raise InvalidMeasurement(f"{origin}: a row cites {row.get('source')!r}, which is "
                                     "not among its sources")
        case = _case(row, sources[row["source"]])
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
                       "sources": list(sources.values()) + extra_sources},
        "switches": {},
        "cases": cases,
    }
    if "sdpa_auto_backend" in transcribed:
        data["sdpa_auto_backend"] = transcribed["sdpa_auto_backend"]
    return data, skipped


def convert_file(path: str | Path) -> tuple[dict[str, Any], list[Skipped]]:
    """A device's transcribed.yaml converted, with the shared row-kernel file's rows."""
    path = Path(path)
    shared, convs = path.parent.parent / ROW_KERNELS_FILE, path.parent.parent / CONVS_FILE
    return convert(read_yaml(path), results.display_path(path),
                   read_yaml(shared) if shared.exists() else None,
                   read_yaml(convs) if convs.exists() else None)


def write_beside(path: str | Path) -> tuple[Path, list[Skipped]]:
    """Convert ``path`` (a transcribed.yaml) and write micro.json beside it."""
    data, skipped = convert_file(path)
    return results.write(Path(path).with_name("micro.json"), data), skipped


def main(argv: list[str]) -> int:
    for arg in argv:
        out, skipped = write_beside(arg)
        print(f"wrote {results.display_path(out)}")
        for s in skipped:
            print(f"  not converted ({s.why}): {s.row.get('kind')} from {s.row.get('source')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
