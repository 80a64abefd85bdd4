"""Collective costs: alpha-beta theory, properties, placement, errors, nccl-tests busBw, and
published all-to-all figures (nccl-tests alltoall_perf and DeepEP)."""

from __future__ import annotations

import importlib
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusim.comm.collectives import (
    COLLECTIVES,
    DEFAULT_TUNING,
    Collective,
    CollectiveTuning,
    algorithm_seconds,
    bus_bandwidth,
    collective_seconds,
    fastest_algorithm,
)
from gpusim.comm.topology import CommGroup, Topology
from gpusim.errors import InvalidConfig
from gpusim.hardware.catalog import load_system
from gpusim.hardware.profile import SystemProfile

GIB = 2**30
NETWORKED = ["dgx-1", "dgx-2", "dgx-a100", "dgx-h100", "hgx-h200", "server-8x-rtx4090"]

systems = st.sampled_from(NETWORKED)
sizes = st.integers(min_value=2, max_value=8)
message_bytes = st.integers(min_value=0, max_value=34).map(lambda e: float(2**e))
collectives = st.sampled_from(COLLECTIVES)


def group(system: str | SystemProfile, num_gpus: int, size: int | None = None) -> CommGroup:
    return Topology.build(system, num_gpus).place(size or num_gpus)


# --- alpha-beta theory ------------------------------------------------------------------


def test_ring_all_reduce_equals_its_alpha_beta_formula() -> None:
    # dgx-a100: 12 NVLink 3 links x 25 GB/s per direction, 1 us per hop.
    n_bytes = 1 * GIB
    expected = 6.6e-6 + 2 * 7 * 1.0e-6 + 2 * 7 / 8 * n_bytes / (12 * 25e9 * 0.80)
    seconds = algorithm_seconds("all_reduce", group("dgx-a100", 8), n_bytes)["ring"]
    assert seconds == pytest.approx(expected, rel=1e-12)


def test_ring_all_gather_moves_n_minus_1_over_n_of_the_buffer() -> None:
    n_bytes = 1 * GIB
    expected = 6.6e-6 + 7 * 1.0e-6 + 7 / 8 * n_bytes / (18 * 25e9 * 0.80)
    assert collective_seconds("all_gather", group("dgx-h100", 8), n_bytes) == pytest.approx(
        expected, rel=1e-12
    )


@settings(max_examples=100, deadline=None)
@given(system=systems, n=sizes, exponent=st.integers(min_value=24, max_value=34))
def test_ring_never_beats_the_2_n_minus_1_over_n_bound(system: str, n: int, exponent: int) -> None:
    placed = group(system, n)
    n_bytes = float(2**exponent)
    seconds = algorithm_seconds("all_reduce", placed, n_bytes)["ring"]
    assert seconds >= 2 * (n - 1) / n * n_bytes / placed.intra_node_bytes_per_s
    # Equivalently: a ring's busBw never exceeds the line rate of the links it uses.
    assert bus_bandwidth("all_reduce", n, n_bytes, seconds) < placed.intra_node_bytes_per_s


@pytest.mark.parametrize("system", ["dgx-a100", "dgx-h100", "dgx-2"])
def test_more_ranks_never_make_a_ring_faster_through_a_switch(system: str) -> None:
    n_bytes = 1 * GIB
    times = [
        algorithm_seconds("all_reduce", group(system, n), n_bytes)["ring"] for n in range(2, 9)
    ]
    assert times == sorted(times)


@settings(max_examples=200, deadline=None)
@given(
    system=systems,
    n=sizes,
    stride=st.sampled_from([1, 2, 4, 8]),
    collective=collectives,
    n_bytes=message_bytes,
)
def test_time_grows_with_bytes(
    system: str, n: int, stride: int, collective: Collective, n_bytes: float
) -> None:
    # Strides up to 8 on 64 GPUs: groups inside one node and across up to eight.
    placed = Topology.build(system, 64).place(n, stride=stride)
    assert collective_seconds(collective, placed, 2 * n_bytes + 1) > collective_seconds(
        collective, placed, n_bytes
    )


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_one_rank_or_no_bytes_costs_nothing(collective: Collective) -> None:
    assert collective_seconds(collective, group("dgx-h100", 8, 1), GIB) == 0.0
    assert collective_seconds(collective, group("dgx-h100", 8), 0) == 0.0
    assert fastest_algorithm(collective, group("dgx-h100", 1), GIB) == (None, 0.0)


def test_less_efficiency_is_never_faster() -> None:
    slower = CollectiveTuning(gpu_link_efficiency=0.5, network_efficiency=0.5)
    placed = group("dgx-a100", 16)
    for collective in COLLECTIVES:
        assert collective_seconds(collective, placed, GIB, slower) > collective_seconds(
            collective, placed, GIB
        )


# --- algorithm choice --------------------------------------------------------------------


def test_tree_wins_tiny_messages_and_ring_large_ones() -> None:
    a100 = group("dgx-a100", 8)
    assert fastest_algorithm("all_reduce", a100, 1024)[0] == "tree"
    assert fastest_algorithm("all_reduce", a100, GIB)[0] == "ring"


def test_nvls_wins_large_all_reduce_on_hopper_switches_only() -> None:
    assert fastest_algorithm("all_reduce", group("dgx-h100", 8), 1024)[0] == "tree"
    assert fastest_algorithm("all_reduce", group("dgx-h100", 8), GIB)[0] == "nvls"
    assert fastest_algorithm("all_reduce", group("hgx-h200", 8), GIB)[0] == "nvls"
    for system in ["dgx-a100", "dgx-2", "dgx-1", "server-8x-rtx4090"]:
        assert "nvls" not in algorithm_seconds("all_reduce", group(system, 8), GIB)
    # NVLS stays inside a node: a group spanning two takes another algorithm.
    assert "nvls" not in algorithm_seconds("all_reduce", group("dgx-h100", 16), GIB)


def test_nvls_roughly_halves_the_traffic() -> None:
    times = algorithm_seconds("all_reduce", group("dgx-h100", 8), 8 * GIB)
    # (1 + 1/8) against 2 x 7/8 bytes per GPU, at 85% NVLS efficiency.
    assert times["ring"] / times["nvls"] == pytest.approx(1.75 / 1.125 * 0.85, rel=0.01)


# --- across nodes --------------------------------------------------------------------------


@pytest.mark.parametrize("system", ["dgx-a100", "dgx-h100", "dgx-1", "server-8x-rtx4090"])
@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "all_to_all", "broadcast"])
def test_two_nodes_are_slower_than_one(system: str, collective: Collective) -> None:
    one = collective_seconds(collective, group(system, 8), GIB)
    two = collective_seconds(collective, group(system, 16), GIB)
    assert two > one
    assert bus_bandwidth(collective, 16, GIB, two) < bus_bandwidth(collective, 8, GIB, one)


def test_hierarchical_wins_two_nodes_with_few_nics() -> None:
    # Four NICs for eight GPUs: the flat ring is NIC-bound, the hierarchy sends 1/8 of it.
    system = load_system("dgx-a100").model_copy(update={"nics_per_node": 4})
    assert fastest_algorithm("all_reduce", group(system, 16), GIB)[0] == "hierarchical"


def test_send_recv_across_nodes_uses_the_network() -> None:
    topology = Topology.build("dgx-h100", 16)
    inside, across = topology.place(2, stride=4), topology.place(2, stride=8)
    assert not inside.spans_nodes and across.spans_nodes
    assert collective_seconds("send_recv", across, GIB) > \
        5 * collective_seconds("send_recv", inside, GIB)


def test_all_to_all_is_bound_by_the_network_share() -> None:
    placed = group("dgx-h100", 16)
    # Half of each rank's buffer leaves the node over its 50 GB/s NIC share at 90%.
    assert collective_seconds("all_to_all", placed, GIB) == \
        pytest.approx(0.5 * GIB / (50e9 * 0.9), rel=0.01)


# --- placement -----------------------------------------------------------------------------


def test_tensor_groups_fill_a_node_and_data_groups_span_nodes() -> None:
    groups = Topology.build("dgx-h100", 64).parallel_groups(tensor=4, data=8, pipeline=2)
    assert (groups["tensor"].ranks_per_node, groups["tensor"].num_nodes) == (4, 1)
    assert (groups["data"].ranks_per_node, groups["data"].num_nodes) == (2, 4)
    assert (groups["pipeline"].ranks_per_node, groups["pipeline"].num_nodes) == (1, 2)


def test_per_gpu_bandwidths() -> None:
    h100 = Topology.build("dgx-h100", 16)
    assert h100.num_nodes == 2
    assert h100.place(8).intra_node_bytes_per_s == pytest.approx(18 * 25e9)
    assert h100.place(2).intra_node_bytes_per_s == pytest.approx(18 * 25e9)  # NVSwitch
    assert h100.inter_node_bytes_per_s == pytest.approx(8 * 50e9 / 8)
    # DGX-1 cube-mesh: a pair of GPUs reaches each other over about 1/7 of six links.
    assert Topology.build("dgx-1", 8).place(2).intra_node_bytes_per_s == pytest.approx(6 * 25e9 / 7)
    # One 100 GbE NIC shared by eight RTX 4090s.
    assert Topology.build("server-8x-rtx4090", 16).inter_node_bytes_per_s == pytest.approx(
        12.5e9 / 8
    )
    assert Topology.build("dgx-h100", 9).num_nodes == 2


def test_nvls_capability() -> None:
    assert Topology.build("dgx-h100", 8).nvls_capable
    assert Topology.build("hgx-h200", 8).nvls_capable
    assert not Topology.build("dgx-a100", 8).nvls_capable
    assert not Topology.build("dgx-2", 16).nvls_capable


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "stride", "match"),
    [
        (9, 1, "more than the job's 8 GPUs"),
        (2, 8, "spans 9 ranks"),
        (0, 1, "size >= 1"),
        (2, 0, "stride >= 1"),
    ],
)
def test_impossible_groups_are_refused(size: int, stride: int, match: str) -> None:
    with pytest.raises(InvalidConfig, match=match):
        Topology.build("dgx-h100", 8).place(size, stride=stride)


def test_spanning_nodes_needs_a_network() -> None:
    with pytest.raises(InvalidConfig, match="has no inter-node link"):
        Topology.build("workstation-rtx4090", 2)
    Topology.build("workstation-rtx4090", 1).place(1)


def test_other_bad_requests_are_refused() -> None:
    with pytest.raises(InvalidConfig, match="at least one GPU"):
        Topology.build("dgx-h100", 0)
    with pytest.raises(InvalidConfig, match="the job has 16 GPUs"):
        Topology.build("dgx-h100", 16).parallel_groups(tensor=8, data=4)
    with pytest.raises(InvalidConfig, match="negative size"):
        collective_seconds("all_reduce", group("dgx-h100", 8), -1)
    with pytest.raises(InvalidConfig, match="unknown collective"):
        collective_seconds("gather", group("dgx-h100", 8), 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfig, match="network_efficiency"):
        CollectiveTuning(network_efficiency=1.5)
    with pytest.raises(InvalidConfig, match="ring_base_latency_s"):
        CollectiveTuning(ring_base_latency_s=-1.0)
    with pytest.raises(InvalidConfig, match="zero seconds"):
        bus_bandwidth("all_reduce", 8, GIB, 0.0)


# --- bus bandwidth, and nccl-tests measurements ------------------------------------------------


def test_bus_bandwidth_follows_nccl_tests() -> None:
    # nccl-tests doc/PERFORMANCE.md: busBw = algBw x 2(n-1)/n for all-reduce, x (n-1)/n for
    # all-gather and reduce-scatter, x 1 for broadcast.
    assert bus_bandwidth("all_reduce", 8, 1e9, 1.0) == pytest.approx(1.75e9)
    assert bus_bandwidth("all_gather", 8, 1e9, 1.0) == pytest.approx(0.875e9)
    assert bus_bandwidth("reduce_scatter", 4, 1e9, 1.0) == pytest.approx(0.75e9)
    assert bus_bandwidth("broadcast", 8, 1e9, 1.0) == pytest.approx(1e9)
    assert bus_bandwidth("all_reduce", 1, 1e9, 0.0) == 0.0


@dataclass(frozen=True)
class NcclCase:
    """One nccl-tests all_reduce_perf peak, as published/dev_cases.yaml records it."""

    id: str
    system: str | SystemProfile
    num_gpus: int
    n_bytes: float
    measured_gb_s: float


_DGX_A100 = load_system("dgx-a100")
_DGX_H100 = load_system("dgx-h100")
_H100_PCIE_PAIR = load_system("h100-pcie-nvlink-pair")

NCCL_CASES = [
    # nccl-tests #212, maintainer: ~480 GB/s peak NVLS busBw on 8x H100 SXM.
    NcclCase("nccl_h100_8gpu_nvls_allreduce_busbw", "dgx-h100", 8, 8 * GIB, 480),
    # nccl-tests #272: 8x H200, -e 4G, NCCL 2.20 (NVLS on by default).
    NcclCase("nccl_h200_8gpu_allreduce_busbw", "hgx-h200", 8, 4 * GIB, 475),
    # nccl-tests #175: 8x A100 on NVSwitch, -e 4G.
    NcclCase("nccl_a100_8gpu_allreduce_busbw", _DGX_A100, 8, 4 * GIB, 232.54),
    # nccl-tests #175: two such nodes, "IB 200Gb x4": four HDR NICs per node, not eight.
    NcclCase(
        "nccl_a100_2node_allreduce_busbw",
        _DGX_A100.model_copy(update={"nics_per_node": 4}),
        16,
        4 * GIB,
        86,
    ),
    # nccl-tests #149: HPE Apollo 6500 (HGX A100 80GB, NVSwitch), -e 1G.
    NcclCase("nccl_a100_80g_hpe_allreduce_busbw", _DGX_A100, 8, 1 * GIB, 200),
    # nccl #1374: 8x H800, whose NVLink is cut to 8 links (400 GB/s both ways).
    NcclCase(
        "nccl_h800_8gpu_allreduce_busbw",
        _DGX_H100.model_copy(update={"intra_node_links_per_gpu": 8}),
        8,
        4 * GIB,
        215,
    ),
]
# nccl #1161: 2x H100 PCIe over NVLink bridges at 4 GiB. The model gives 240 GB/s from the
# datasheet's 600 GB/s; the log shows 116, about half, unexplained in the thread.
NCCL_MISSES = [NcclCase("nccl_h100pcie_2gpu_nvlink_bridge", _H100_PCIE_PAIR, 2, 4 * GIB, 116.26)]

# Errors of the stated defaults (not fitted): -0.9, +0.0, +3.1, +18.4, +19.7, -1.7 %. The
# NVSwitch single-node cases are within 5%; the 2-node case (+18%: the model's hierarchical
# schedule beats NCCL's NIC-bound ring) and the HPE node (+20%: its own p2p test shows slow
# links) set the bound.
NCCL_TOLERANCE = 0.25
NCCL_MEAN_TOLERANCE = 0.10


def predicted_bus_gb_s(case: NcclCase) -> float:
    placed = group(case.system, case.num_gpus)
    seconds = collective_seconds("all_reduce", placed, case.n_bytes, DEFAULT_TUNING)
    return bus_bandwidth("all_reduce", case.num_gpus, case.n_bytes, seconds) / 1e9


@pytest.mark.parametrize("case", NCCL_CASES, ids=lambda c: c.id)
def test_nccl_tests_bus_bandwidth_within_tolerance(case: NcclCase) -> None:
    error = predicted_bus_gb_s(case) / case.measured_gb_s - 1
    assert abs(error) <= NCCL_TOLERANCE, f"{case.id}: {100 * error:+.1f}%"


def test_nccl_tests_mean_error() -> None:
    errors = [abs(predicted_bus_gb_s(c) / c.measured_gb_s - 1) for c in NCCL_CASES]
    assert statistics.mean(errors) <= NCCL_MEAN_TOLERANCE


@pytest.mark.xfail(strict=True, reason="2x H100 PCIe bridge measures half the datasheet rate")
@pytest.mark.parametrize("case", NCCL_MISSES, ids=lambda c: c.id)
def test_known_misses(case: NcclCase) -> None:
    assert abs(predicted_bus_gb_s(case) / case.measured_gb_s - 1) <= NCCL_TOLERANCE


def test_cases_match_the_shared_reference() -> None:
    path = Path(__file__).resolve().parents[1] / "published" / "dev_cases.yaml"
    rows = yaml.safe_load(path.read_text())["D_interconnect"]
    reference = {
        r["id"]: float(re.sub(r"[^0-9.]", "", str(r["value"])))
        for r in rows
        if r["id"].startswith("nccl_")
    }
    assert {c.id: c.measured_gb_s for c in NCCL_CASES + NCCL_MISSES} == reference


# --- all-to-all: published/all_to_all.yaml through benchmarks/collectives.py ------------------

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def collectives_benchmark(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """benchmarks/collectives.py, whose all-to-all section maps each published row."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("collectives")


def all_to_all_rows() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = yaml.safe_load(
        (ROOT / "published" / "all_to_all.yaml").read_text()
    )["cases"]
    return rows


# As of this commit (python benchmarks/collectives.py), the model's stated defaults against 20
# compared rows (2 more skipped: an 8-GPU Blackwell node has no profile; DeepEP's low-latency
# kernels send on-node traffic over RDMA):
# - 17 bandwidth rows, mean absolute error 20.5%. nccl-tests busBw (5 rows) 15.0%: one node
#   -6.0% (8x A100) and +6.8% (4x H100), two nodes +11.6% (2x8 A100, HDR) and +5.4% (2x8 H800,
#   CX7), and +45.3% for one A100 per node (a single network peer gets 15.5 of HDR's 25 GB/s).
#   DeepEP algBw (12 rows) 22.8%: inside a node +18.5/+15.2%, across nodes within 11% except V1
#   on 2 nodes, +106/+108% (its tokens are forwarded over H800's cut NVLink after the RDMA hop,
#   3.3x the RDMA bytes, which binds first; gpusim's all-to-all has no such second hop).
# - 3 latency-bound rows (1 KiB), mean absolute error 56.2%: -18.6% in one node, -68.8% and
#   -81.3% across two (measured 30 and 50 us; the model charges one 2.7 us network step).
A2A_BANDWIDTH_MEAN_BUDGET = 0.21
A2A_NCCL_TESTS_BANDWIDTH_MEAN_BUDGET = 0.16
A2A_LATENCY_MEAN_BUDGET = 0.57


def test_every_all_to_all_row_is_compared_or_skipped_with_a_reason(
    collectives_benchmark: ModuleType,
) -> None:
    rows = all_to_all_rows()
    assert {r["id"] for r in rows} == set(collectives_benchmark.A2A_SYSTEMS)
    results, skipped = collectives_benchmark.all_to_all_results(rows)
    assert (len(results), len(skipped)) == (20, 2)
    assert all(reason for reason in skipped.values())
    # Inside a node and across nodes, nccl-tests and DeepEP, bandwidth and latency.
    by_id = {r["id"]: r for r in rows}
    compared = [(by_id[r.id]["nodes"] > 1, r.kind, r.latency_bound) for r in results]
    for across in (False, True):
        for kind in ("nccl-tests", "deepep"):
            assert (across, kind, False) in compared
        assert (across, "nccl-tests", True) in compared


def test_all_to_all_mappings_follow_their_formulas(collectives_benchmark: ModuleType) -> None:
    results = {r.id: r for r in collectives_benchmark.all_to_all_results(all_to_all_rows())[0]}
    # DeepEP inside an H800 node: algBw, (n-1)/n of the bytes over 8 NVLinks at 80%.
    nvlink = 8 * 25 * 0.80
    assert results["deepep_v1_h800_ep8_dispatch_fp8"].predicted == pytest.approx(
        nvlink * 8 / 7, rel=0.01
    )
    # DeepEP across N nodes: (N-1)/N of the bytes leave the node over one NDR NIC at 90%.
    across = [("deepep_v1_h800_ep32_dispatch_fp8", 4), ("deepep_v2_sm90_ep8x2_dispatch_fp8", 2)]
    for case, nodes in across:
        assert results[case].predicted == pytest.approx(50 * 0.9 * nodes / (nodes - 1), rel=0.01)
    # nccl-tests busBw on 2 nodes of 8: algBw 2 x the NIC's share, times 15/16.
    assert results["a2a_ndmv4_a100_2x8_busbw_4g"].predicted == pytest.approx(
        2 * 25 * 0.9 * 15 / 16, rel=0.01
    )


def test_all_to_all_errors_stay_within_budget(collectives_benchmark: ModuleType) -> None:
    results = collectives_benchmark.all_to_all_results(all_to_all_rows())[0]
    mean = collectives_benchmark.mean_abs_error
    bandwidth = [r for r in results if not r.latency_bound]
    assert mean(bandwidth) <= A2A_BANDWIDTH_MEAN_BUDGET
    assert mean([r for r in bandwidth if r.kind == "nccl-tests"]) <= (
        A2A_NCCL_TESTS_BANDWIDTH_MEAN_BUDGET
    )
    assert mean([r for r in results if r.latency_bound]) <= A2A_LATENCY_MEAN_BUDGET
