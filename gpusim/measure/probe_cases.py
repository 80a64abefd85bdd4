"""The GPU probes' fp32 attention timings as a micro-suite file the fit reads.

measurements/gpu_probes.py (probe ``sdpa32``) times SDPA on fp32 inputs per backend, each
shape's forward alone and forward with backward, with CUDA events around one call (median
of 15). The memory-efficient backend's rows (the kernel SDPA picks for fp32, which
FlashAttention and cuDNN refuse) become micro cases of kind ``sdpa``, precision fp32, written
beside the probes as ``micro-sdpa32.json``. The math and written-out rows stay in the probes
file: no fit reads them.

    python -m gpusim.measure.probe_cases measurements/h100-sxm/probes.json
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from gpusim.errors import InvalidMeasurement
from gpusim.measure import results

OUTPUT_NAME = "micro-sdpa32.json"
PASSES = {"forward": "forward_s", "forward_backward": "forward_backward_s"}
# gpu_probes._events_time: the median of this many samples of one call each
PROBE_REPEATS = 15


def _cases(row: dict[str, Any]) -> list[dict[str, Any]]:
    shape = (f"{row['batch']}x{row['heads']}x{row['heads']}x{row['seq']}x{row['head_dim']}"
             + ("-causal" if row["causal"] else ""))
    return [{"id": f"sdpa/fp32/efficient/{shape}/{pass_}", "kind": "sdpa",
             "precision": "fp32", "backend": "efficient", "batch": row["batch"],
             "heads": row["heads"], "kv_heads": row["heads"], "seq": row["seq"],
             "head_dim": row["head_dim"], "causal": row["causal"], "pass": pass_,
             "median_s": row[key], "repeats": PROBE_REPEATS, "inner": 1}
            for pass_, key in PASSES.items() if key in row]


def convert(probes: dict[str, Any], device: str, origin: str) -> dict[str, Any]:
    """The micro-suite data of ``probes``' fp32 memory-efficient attention rows."""
    rows = probes.get("sdpa32", {}).get("cases", [])
    if not rows:
        raise InvalidMeasurement(f"{origin}: no sdpa32 probe rows")
    cases = [c for row in rows if row.get("backend") == "efficient" and "error" not in row
             for c in _cases(row)]
    return {
        "schema_version": results.SCHEMA_VERSION, "suite": "micro", "device": device,
        "quick": False,
        "provenance": {"date": probes.get("date", ""), "gpu": probes.get("device", ""),
                       "torch": probes.get("torch", ""), "cuda": probes.get("cuda", ""),
                       "derived_from": origin,
                       "command": f"python -m gpusim.measure.probe_cases {origin}",
                       "timing": "CUDA events around one call, median of "
                                 f"{PROBE_REPEATS}; matmul TF32 "
                                 + ("allowed" if rows[0].get("allow_tf32") else "off")},
        "switches": {"matmul_allow_tf32": bool(rows[0].get("allow_tf32"))},
        "cases": cases,
    }


def convert_file(path: str | Path) -> dict[str, Any]:
    """A device's probes.json converted (the device is its folder's name)."""
    path = Path(path)
    return convert(results.read_json(path), path.parent.name, results.display_path(path))


def write_beside(path: str | Path) -> Path:
    return results.write(Path(path).with_name(OUTPUT_NAME), convert_file(path))


def main(argv: list[str]) -> int:
    for arg in argv:
        print(f"wrote {results.display_path(write_beside(arg))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
