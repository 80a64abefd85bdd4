"""Predicted against published nccl-tests all-reduce and all-to-all figures, then a size sweep.

Reads the ``nccl_`` rows of published/dev_cases.yaml, predicts
each with gpusim's collective model at its stated defaults (never fitted to these rows), and
prints predicted and measured busBw with the relative error, then the mean absolute error.
Then the same for all-to-all against published/all_to_all.yaml: nccl-tests alltoall_perf rows
(busBw, or time for latency-bound sizes) and DeepEP's dispatch/combine bandwidths.
Last, all-reduce time against message size on one 8-GPU DGX H100, with the algorithm chosen.

    python benchmarks/collectives.py [path/to/dev_cases.yaml [path/to/all_to_all.yaml]]
"""

from __future__ import annotations

import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpusim.comm.collectives import (
    algorithm_seconds,
    bus_bandwidth,
    collective_seconds,
    fastest_algorithm,
)
from gpusim.comm.topology import CommGroup, Topology
from gpusim.hardware.catalog import load_system
from gpusim.hardware.profile import SystemProfile
from gpusim.units import GIB, KIB, human_bytes
from gpusim.workload.moe import expected_destinations

DEFAULT = Path(__file__).resolve().parents[1] / "published" / "dev_cases.yaml"
ALL_TO_ALL = Path(__file__).resolve().parents[1] / "published" / "all_to_all.yaml"

_A100 = load_system("dgx-a100")
_H100 = load_system("dgx-h100")
_H100_PCIE_PAIR = load_system("h100-pcie-nvlink-pair")
# H800: the H100 with NVLink cut to 8 links (400 GB/s both ways).
_H800 = _H100.model_copy(update={"name": "h800-8gpu", "intra_node_links_per_gpu": 8})

# Case id -> (system, GPUs, message bytes). Sizes are the largest each run reports.
SETUPS: dict[str, tuple[SystemProfile, int, float]] = {
    "nccl_h100_8gpu_nvls_allreduce_busbw": (_H100, 8, 8 * GIB),
    "nccl_h200_8gpu_allreduce_busbw": (load_system("hgx-h200"), 8, 4 * GIB),
    "nccl_a100_8gpu_allreduce_busbw": (_A100, 8, 4 * GIB),
    # "IB 200Gb x4": four HDR NICs per node where a DGX A100 has eight.
    "nccl_a100_2node_allreduce_busbw": (_A100.model_copy(update={"nics_per_node": 4}), 16, 4 * GIB),
    "nccl_a100_80g_hpe_allreduce_busbw": (_A100, 8, 1 * GIB),
    "nccl_h100pcie_2gpu_nvlink_bridge": (_H100_PCIE_PAIR, 2, 4 * GIB),
    "nccl_h800_8gpu_allreduce_busbw": (_H800, 8, 4 * GIB),
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


# --- all-to-all: published/all_to_all.yaml --------------------------------------------------

# Case id -> the gpusim system it runs on, or why it is not compared. Groups are placed as the
# rows state them: nodes x GPUs per node, one rank per GPU.
#
# DeepEP rows are compared as algBw: DeepEP divides the bytes a rank moves over the named
# channel, its own share included (its README: "logical bandwidth ... contains local rank
# traffic"), by the time. gpusim's all-to-all of that many bytes per rank, over the same
# ranks, is the model of it: inside a node the (n-1)/n that leave the GPU cross NVLink, across
# N nodes the (N-1)/N that leave the node cross the NICs, so n_bytes / seconds is the figure
# to set beside DeepEP's. The bytes are the expected count of DeepEP's tests (tokens x hidden
# x bytes per element x distinct destinations), which only matters through the fixed latency.
# DeepEP routes unevenly and forwards cross-node tokens over NVLink after the RDMA hop; gpusim
# models neither, so where that two-hop schedule is the bottleneck the model is optimistic.
A2A_SYSTEMS: dict[str, SystemProfile | str] = {
    # Azure NDm A100 v4: 8x A100 80GB SXM4 on NVSwitch and eight HDR NICs, as a DGX A100.
    "a2a_ndmv4_a100_1x8_busbw_1g": _A100,
    "a2a_ndmv4_a100_1x8_time_1k": _A100,
    "a2a_ndmv4_a100_2x8_busbw_4g": _A100,
    "a2a_ndmv4_a100_2x1_busbw_1g": _A100,
    "a2a_ndmv4_a100_2x8_time_1k": _A100,
    "a2a_ndmv4_a100_2x1_time_1k": _A100,
    # Four H100 SXM of a node: through NVSwitch each has all 18 links whatever the group size.
    "a2a_nccl2169_h100_1x4_busbw_500m": _H100,
    # The log says H800 (a comment says H100); 8 CX7 per node taken as NDR 400 Gb/s. Across
    # two nodes the NICs bind, so H100 and H800 predict the same.
    "a2a_nccltests355_h800_2x8_busbw_4g": _H800,
    "deepep_v1_h800_ep8_dispatch_fp8": _H800,
    "deepep_v1_h800_ep8_combine_bf16": _H800,
    "deepep_v1_h800_ep16_dispatch_fp8": _H800,
    "deepep_v1_h800_ep16_combine_bf16": _H800,
    "deepep_v1_h800_ep32_dispatch_fp8": _H800,
    "deepep_v1_h800_ep32_combine_bf16": _H800,
    "deepep_v1_h800_ep64_dispatch_fp8": _H800,
    "deepep_v1_h800_ep64_combine_bf16": _H800,
    # "SM90 | CX7": the GPU is not named; one 400 Gb/s CX7 per GPU as in V1. NIC-bound, so
    # DGX H100 and the H800 predict the same.
    "deepep_v2_sm90_ep8x2_dispatch_fp8": _H100,
    "deepep_v2_sm90_ep8x2_combine_bf16": _H100,
    "deepep_v2_sm90_ep8x4_dispatch_fp8": _H100,
    "deepep_v2_sm90_ep8x4_combine_bf16": _H100,
    "deepep_v2_sm100_ep8_dispatch_fp8": "no gpusim profile of an 8-GPU Blackwell (SM100) node",
    "deepep_v1_h800_ll_ep8_dispatch_fp8": (
        "low-latency kernels reach same-node peers over RDMA too, one message per expert; "
        "gpusim's all-to-all sends on-node bytes over NVLink"
    ),
}

_BANDWIDTH_METRICS = ("busbw", "algbw", "logical_bw")


@dataclass(frozen=True)
class AllToAllResult:
    """One compared row: gpusim's figure and the measured one, in the row's unit."""

    id: str
    kind: str
    metric: str
    unit: str
    system: str
    num_gpus: int
    n_bytes: float
    predicted: float
    measured: float

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured

    @property
    def latency_bound(self) -> bool:
        return self.metric == "time"


def deepep_bytes_per_rank(row: dict[str, Any]) -> float:
    """The bytes one rank moves as DeepEP's tests count them, in expectation.

    Tokens x hidden x bytes per element x the expected number of distinct destinations its
    top-k experts fall in: ranks inside a node, nodes across nodes (V1 first picks
    ``topk_groups`` nodes, then the experts among theirs), the rank's own included.
    """
    batch = row["deepep"]
    units = row["nodes"] if row["nodes"] > 1 else row["num_gpus"]
    destinations = expected_destinations(units, batch["num_experts"], batch["topk"],
                                         batch["topk_groups"])
    return float(
        batch["tokens_per_rank"] * batch["hidden"] * batch["bytes_per_element"] * destinations
    )


def all_to_all_group(row: dict[str, Any], system: SystemProfile) -> CommGroup:
    """The row's ranks on ``system``: ``gpus_per_node`` of each of ``nodes`` nodes."""
    nodes, per_node = row["nodes"], row["gpus_per_node"]
    if per_node > system.gpus_per_node or system.gpus_per_node % per_node:
        raise ValueError(f"{row['id']}: {per_node} GPUs per node on a {system.name} node")
    stride = system.gpus_per_node // per_node if nodes > 1 else 1
    group = Topology.build(system, nodes * system.gpus_per_node).place(
        row["num_gpus"], stride=stride
    )
    if (group.num_nodes, group.ranks_per_node) != (nodes, per_node):
        raise ValueError(
            f"{row['id']}: placed on {group.num_nodes} nodes of {group.ranks_per_node}"
        )
    return group


def predict_all_to_all(row: dict[str, Any], system: SystemProfile) -> AllToAllResult:
    """gpusim's all-to-all for the row, in the row's own metric and unit."""
    n = row["num_gpus"]
    n_bytes = (
        deepep_bytes_per_rank(row) if row["kind"] == "deepep" else float(row["message_bytes"])
    )
    seconds = collective_seconds("all_to_all", all_to_all_group(row, system), n_bytes)
    metric, unit = row["metric"], row["unit"]
    if metric == "time":
        if unit != "us":
            raise ValueError(f"{row['id']}: time in {unit}, expected us")
        predicted = seconds * 1e6
    elif metric in _BANDWIDTH_METRICS:
        if unit != "GB/s":
            raise ValueError(f"{row['id']}: bandwidth in {unit}, expected GB/s")
        if metric == "busbw":
            predicted = bus_bandwidth("all_to_all", n, n_bytes, seconds) / 1e9
        else:  # algBw, and DeepEP's logical bandwidth (bytes with the rank's own, over time)
            predicted = n_bytes / seconds / 1e9
    else:
        raise ValueError(f"{row['id']}: unknown metric {metric!r}")
    return AllToAllResult(
        row["id"], row["kind"], metric, unit, system.name, n, n_bytes, predicted,
        float(row["value"]),
    )


def all_to_all_results(
    rows: list[dict[str, Any]],
) -> tuple[list[AllToAllResult], dict[str, str]]:
    """Every mapped row's comparison, and the reason for each row not compared."""
    results, skipped = [], {}
    for row in rows:
        system = A2A_SYSTEMS.get(row["id"], "no gpusim system mapped")
        if isinstance(system, str):
            skipped[row["id"]] = system
        else:
            results.append(predict_all_to_all(row, system))
    return results, skipped


def mean_abs_error(results: list[AllToAllResult]) -> float:
    return statistics.mean(abs(r.error) for r in results)


def compare_all_to_all(rows: list[dict[str, Any]]) -> None:
    results, skipped = all_to_all_results(rows)
    print("\nall-to-all against published/all_to_all.yaml (model defaults, not fitted)")
    print(
        f"{'case':36s} {'system':16s} {'n':>3s} {'size':>11s} {'metric':>10s} "
        f"{'pred':>8s} {'meas':>8s} {'unit':>5s} {'error':>8s}"
    )
    for r in results:
        print(
            f"{r.id:36s} {r.system:16s} {r.num_gpus:3d} {human_bytes(r.n_bytes):>11s} "
            f"{r.metric:>10s} {r.predicted:8.2f} {r.measured:8.2f} {r.unit:>5s} "
            f"{100 * r.error:+7.1f}%"
        )
    for case, reason in skipped.items():
        print(f"{case:36s} skipped: {reason}")
    groups = {
        "nccl-tests busBw": [r for r in results if r.kind == "nccl-tests" and not r.latency_bound],
        "DeepEP algBw (logical)": [r for r in results if r.kind == "deepep"],
        "all bandwidth rows": [r for r in results if not r.latency_bound],
        "latency-bound (time)": [r for r in results if r.latency_bound],
    }
    print()
    for name, members in groups.items():
        if members:
            errors = [abs(r.error) for r in members]
            print(
                f"{name:24s} {len(members):2d} rows: mean absolute error "
                f"{100 * statistics.mean(errors):5.1f}%, median "
                f"{100 * statistics.median(errors):5.1f}%, max {100 * max(errors):5.1f}%"
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


def main(path: Path = DEFAULT, all_to_all: Path = ALL_TO_ALL) -> None:
    for name, file in (("dev_cases.yaml", path), ("all_to_all.yaml", all_to_all)):
        if not file.is_file():
            sys.exit(f"{name} not found at {file}; pass its path")
    rows = [
        r for r in yaml.safe_load(path.read_text())["D_interconnect"] if r["id"].startswith("nccl_")
    ]
    compare(rows)
    compare_all_to_all(yaml.safe_load(all_to_all.read_text())["cases"])
    sweep()
    print("Collective model: stated defaults (CollectiveTuning), not fitted to these rows.")


if __name__ == "__main__":
    main(*(Path(arg) for arg in sys.argv[1:3]))
