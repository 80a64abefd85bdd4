"""Board power limits: the clock a limit leaves dense matrix work, the profile field, the
--power-limit flag, and the fit of the clock model to published sweeps."""

from __future__ import annotations

import pytest
import yaml

from gpusim.calibrate.power import Point, fit, predicted, sweeps
from gpusim.data import data_dir
from gpusim.errors import GpusimError, InvalidConfig
from gpusim.estimation import estimate
from gpusim.explore.values import with_fields
from gpusim.hardware.calibration import calibration_for
from gpusim.hardware.catalog import load_gpu
from gpusim.hardware.power import (
    PowerCalibration,
    clock_fraction,
    compute_rate_factor,
    load_power_file,
    power_file,
    with_power_limit,
)

POWER = PowerCalibration(name="test-power", architecture="hopper", demand_fraction=1.2,
                         exponent=3.0)


def test_clock_falls_with_the_limit_and_is_whole_above_the_demand() -> None:
    fractions = [clock_fraction(f / 10, 0.2, POWER) for f in range(3, 14)]
    assert fractions == sorted(fractions)
    assert clock_fraction(1.2, 0.2, POWER) == 1.0
    assert clock_fraction(1.3, 0.2, POWER) == 1.0
    # at the TDP, (0.8 / 1.0) ** (1/3) of the boost clock
    assert clock_fraction(1.0, 0.2, POWER) == pytest.approx(0.8 ** (1 / 3))


def test_rate_is_relative_to_the_limit_the_calibration_was_measured_at() -> None:
    gpu = load_gpu("h100-sxm")
    assert compute_rate_factor(gpu, 0.2, POWER) == pytest.approx(1.0)
    assert compute_rate_factor(gpu, 0.2, None) == 1.0
    capped = with_power_limit(gpu, 500, 0.2)
    expected = ((500 / 700 - 0.2) / 0.8) ** (1 / 3)  # both below the demand: its share cancels
    assert compute_rate_factor(capped, 0.2, POWER) == pytest.approx(expected, rel=1e-3)


def test_a_limit_must_lie_between_idle_power_and_the_tdp() -> None:
    gpu = load_gpu("h100-sxm")
    with pytest.raises(InvalidConfig, match="above h100-sxm's TDP"):
        with_power_limit(gpu, 800, 0.2)
    with pytest.raises(InvalidConfig, match="idle power"):
        with_power_limit(gpu, 100, 0.2)
    with pytest.raises(GpusimError, match="exceeds tdp_w"):
        with_fields(gpu, {"power_limit_w": 900})


def test_the_hbm2e_h100_ships_at_500_w() -> None:
    gpu = load_gpu("h100-sxm-96gb")
    assert (gpu.power_limit, gpu.tdp_w, gpu.memory_bandwidth_gb_s) == (500, 700, 2400)
    assert load_gpu("h100-sxm").power_limit == 700


def test_a_lower_limit_never_trains_faster_and_costs_less_power() -> None:
    runs = {w: estimate("gpt2", "h100-sxm", 8, power_limit_w=w) for w in (700, 500, 300)}
    times = [runs[w].step.step_time_s for w in (700, 500, 300)]
    assert times[0] < times[1] < times[2]
    assert runs[300].average_power_w < runs[700].average_power_w
    text = "\n".join(runs[500].assumptions)
    assert "500 W power limit" in text


def test_the_limit_applies_to_a_systems_gpus() -> None:
    free = estimate("gpt2", None, 16, system="dgx-h100", num_gpus=2)
    capped = estimate("gpt2", None, 16, system="dgx-h100", num_gpus=2, power_limit_w=400)
    assert capped.step.step_time_s >= free.step.step_time_s
    assert any("400 W power limit" in a for a in capped.assumptions)


def test_the_fit_recovers_the_model_that_made_the_sweep() -> None:
    truth = PowerCalibration(name="t", architecture="hopper", demand_fraction=1.35,
                             exponent=2.5)
    limits = [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    # a sweep of throughput (its shape only) and one of sustained clocks (of the boost clock)
    top = clock_fraction(1.0, 0.2, truth)
    points = [Point("shape", f, 1.0, clock_fraction(f, 0.2, truth) / top) for f in limits]
    points += [Point("clocks", f, None, clock_fraction(f, 0.2, truth)) for f in limits]
    got = fit("hopper", points, 0.2, ["synthetic"])
    assert got.demand_fraction == pytest.approx(1.35, abs=0.02)
    assert got.exponent == pytest.approx(2.5, abs=0.1)
    assert all(predicted(p, 0.2, got) == pytest.approx(p.relative, rel=0.01) for p in points)


def test_the_shipped_power_fit_is_the_fit_of_the_published_sweeps() -> None:
    path = data_dir("measurements") / "published" / "power_limits.yaml"
    rows = yaml.safe_load(path.read_text())["rows"]
    measured = {"hopper": "h100-sxm", "cdna3": "mi300x"}
    assert set(sweeps(rows)) == set(measured)
    for arch, points in sweeps(rows).items():
        shipped = load_power_file(power_file(arch))
        idle = calibration_for(load_gpu(measured[arch])).idle_power_fraction
        refit = fit(arch, points, idle, [])
        assert (refit.demand_fraction, refit.exponent) == (
            shipped.demand_fraction, shipped.exponent)
        assert shipped.measured_device == measured[arch]


def test_every_published_power_row_names_its_source() -> None:
    path = data_dir("measurements") / "published" / "power_limits.yaml"
    data = yaml.safe_load(path.read_text())
    for row in data["rows"] + data.get("rows_uncatalogued_devices", []):
        assert row["source"].get("url") and row["source"].get("where"), row["id"]
        assert row["kind"] in ("gemm", "clock", "training", "triad"), row["id"]


def test_a_part_on_the_same_die_takes_the_clock_its_own_limit_allows() -> None:
    """Powers are on the measured device's scale, another part's demand grown with its
    compute units times its boost clock: an MI325X (MI300X die, 1000 W against 750 W)
    keeps a higher clock, an H100 PCIe (114 SMs at 1755 MHz, 350 W) a lower one; parts of
    the measured die at its TDP are unchanged."""
    def factor(name: str) -> float:
        device = load_gpu(name)
        cal = calibration_for(device)
        return compute_rate_factor(device, cal.idle_power_fraction, cal.power)

    assert factor("mi300x") == 1.0 and factor("h100-sxm") == 1.0 and factor("h200") == 1.0
    # AMD's Table 1 (Measuring Max-Achievable FLOPs, Part 2): bf16 843 against 708 TFLOP/s
    assert factor("mi325x") == pytest.approx(843 / 708, rel=0.03)
    assert 0.8 < factor("h100-pcie") < 0.92
    assert factor("h100-sxm-96gb") == pytest.approx(0.872, abs=0.01)  # its 500 W limit


def test_one_source_s_runs_on_two_parts_of_one_die_are_a_sweep() -> None:
    path = data_dir("measurements") / "published" / "power_limits.yaml"
    rows = yaml.safe_load(path.read_text())["rows"]
    cdna3 = sweeps(rows)["cdna3"]
    assert {p.sweep.split(":")[0] for p in cdna3} == {"mi300x/mi325x"}
    limits = sorted({round(p.limit_fraction, 3) for p in cdna3})
    assert limits == [1.0, round(1000 / 750, 3)]  # on the MI300X's scale


def test_a_measured_sustained_clock_sets_the_compute_rate_where_no_power_fit_exists() -> None:
    """The T4 (Turing: no power calibration) states the clock it settles at under load
    (~900 MHz at its 70 W limit, measured in an MLPerf run): compute-bound kernels run at
    that share of the boost clock's rate, memory-bound ones as before, and the estimate
    says so. An architecture with a power calibration keeps its own model, and a sustained
    clock above the boost clock is refused."""
    from gpusim.cost.kernels import kernel_cost
    from gpusim.hardware.profile import GPUProfile
    from gpusim.workload.ops import GemmShape, gemm_op, memory_op

    t4 = load_gpu("t4")
    boost = t4.model_copy(update={"sustained_clock_mhz": None})
    cal = calibration_for(t4)
    product = gemm_op("p", GemmShape(4096, 4096, 4096), "fp16", 2)
    copy = memory_op("c", 2**28, 2**28, 4)
    assert kernel_cost(product, t4, cal).seconds == pytest.approx(
        kernel_cost(product, boost, cal).seconds * 1590 / 900, rel=0.02)
    assert kernel_cost(copy, t4, cal).seconds == kernel_cost(copy, boost, cal).seconds
    notes = estimate(model="resnet50", gpu="t4", batch_size=64, precision="fp16").assumptions
    assert any("900 MHz" in n and "57%" in n for n in notes)
    h100 = load_gpu("h100-sxm")
    held = h100.model_copy(update={"sustained_clock_mhz": 1000.0})
    assert compute_rate_factor(held, 0.1, calibration_for(h100).power) == pytest.approx(
        compute_rate_factor(h100, 0.1, calibration_for(h100).power))
    with pytest.raises(ValueError, match="exceeds boost_clock_mhz"):
        GPUProfile.model_validate({**t4.model_dump(), "sustained_clock_mhz": 2000})
