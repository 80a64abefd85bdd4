"""Predicted against published nccl-tests all-reduce bus bandwidth, then a size sweep.

Reads the ``nccl_`` rows of published/dev_cases.yaml, predicts
each with gpusim's collective model at its stated defaults (never fitted to these rows), and
prints predicted and measured busBw with the relative error, then the mean absolute error.
Last, all-reduce time against message size on one 8-GPU DGX H100, with the algorithm chosen.

    python benchmarks/collectives.py [path/to/dev_cases.yaml]
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

from gpusim.comm.collectives import algorithm_seconds, bus_bandwidth, fastest_algorithm
from gpusim.comm.topology import Topology
from gpusim.hardware.catalog import load_system
from gpusim.hardware.profile import SystemProfile
from gpusim.units import GIB, KIB, human_bytes

DEFAULT = Path(__file__).resolve().parents[1] / "published" / "dev_cases.yaml"

_A100 = load_system("dgx-a100")
_H100 = load_system("dgx-h100")
_H100_PCIE_PAIR = load_system("h100-pcie-nvlink-pair")

# Case id -> (system, GPUs, message bytes). Sizes are the largest each run reports.
SETUPS: dict[str, tuple[SystemProfile, int, float]] = {
    "nccl_h100_8gpu_nvls_allreduce_busbw": (_H100, 8, 8 * GIB),
    "nccl_h200_8gpu_allreduce_busbw": (load_system("hgx-h200"), 8, 4 * GIB),
    "nccl_a100_8gpu_allreduce_busbw": (_A100, 8, 4 * GIB),
    # "IB 200Gb x4": four HDR NICs per node where a DGX A100 has eight.
    "nccl_a100_2node_allreduce_busbw": (_A100.model_copy(update={"nics_per_node": 4}), 16, 4 * GIB),
    "nccl_a100_80g_hpe_allreduce_busbw": (_A100, 8, 1 * GIB),
    "nccl_h100pcie_2gpu_nvlink_bridge": (_H100_PCIE_PAIR, 2, 4 * GIB),
    # H800: the H100 with NVLink cut to 8 links (400 GB/s both ways).
    "nccl_h800_8gpu_allreduce_busbw": (
        _H100.model_copy(update={"name": "h800-8gpu", "intra_node_links_per_gpu": 8}),
        8,
        4 * GIB,
    ),
}


def _measured_gb_s(row: dict[str, Any]) -> float:
    """The row's value as a number ("~480" -> 480)."""
    return float(re.sub(r"[^0-9.]", "", str(row["value"])))


def compare(rows: list[dict[str, Any]]) -> None:
    errors = []
    print(f"{'case':38s} {'system':28s} {'algorithm':>12s} {'pred':>7s} {'meas':>7s} {'error':>8s}")
    for row in rows:
        if row["id"] not in SETUPS:
            print(f"{row['id']:38s} skipped: no setup mapped")
            continue
        system, num_gpus, n_bytes = SETUPS[row["id"]]
        group = Topology.build(system, num_gpus).place(num_gpus)
        algorithm, seconds = fastest_algorithm("all_reduce", group, n_bytes)
        predicted = bus_bandwidth("all_reduce", num_gpus, n_bytes, seconds) / 1e9
        measured = _measured_gb_s(row)
        error = (predicted - measured) / measured
        errors.append(abs(error))
        print(
            f"{row['id']:38s} {f'{system.name} x{num_gpus}':28s} {algorithm or '-':>12s} "
            f"{predicted:7.1f} {measured:7.1f} {100 * error:+7.1f}%"
        )
    if errors:
        print(
            f"\n{len(errors)} cases (busBw, GB/s): mean absolute error "
            f"{100 * statistics.mean(errors):.1f}%, median {100 * statistics.median(errors):.1f}%, "
            f"max {100 * max(errors):.1f}%"
        )


def sweep() -> None:
    group = Topology.build("dgx-h100", 8).place(8)
    print("\nall-reduce on one DGX H100 (8 GPUs), fastest algorithm per size")
    print(f"{'size':>12s} {'algorithm':>10s} {'time us':>10s} {'algBw':>8s} {'busBw':>8s}  GB/s")
    n_bytes = 1 * KIB
    while n_bytes <= 8 * GIB:
        algorithm, seconds = fastest_algorithm("all_reduce", group, n_bytes)
        times = algorithm_seconds("all_reduce", group, n_bytes)
        assert algorithm is not None and seconds == min(times.values())
        bus_gb_s = bus_bandwidth("all_reduce", 8, n_bytes, seconds) / 1e9
        print(
            f"{human_bytes(n_bytes):>12s} {algorithm:>10s} {seconds * 1e6:10.1f} "
            f"{n_bytes / seconds / 1e9:8.1f} {bus_gb_s:8.1f}"
        )
        n_bytes *= 8


def main(path: Path = DEFAULT) -> None:
    if not path.is_file():
        sys.exit(f"dev_cases.yaml not found at {path}; pass its path")
    rows = [
        r for r in yaml.safe_load(path.read_text())["D_interconnect"] if r["id"].startswith("nccl_")
    ]
    compare(rows)
    sweep()
    print("Collective model: stated defaults (CollectiveTuning), not fitted to these rows.")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
