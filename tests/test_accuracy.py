"""The error budget on the committed measurements: a change that makes predictions worse
fails here. Budgets live in measurements/budgets.yaml, set from what was measured and only
ever tightened."""

from __future__ import annotations

import math

import pytest
import yaml

from gpusim.measure import results
from gpusim.validate.compare import DeviceReport, validate_file

BUDGETS = yaml.safe_load((results.measurements_dir() / "budgets.yaml").read_text())["devices"]
MEASURED = sorted(results.measurements_dir().glob("*/models.json"))


@pytest.fixture(scope="module", params=MEASURED, ids=lambda p: p.parent.name)
def report(request: pytest.FixtureRequest) -> DeviceReport:
    return validate_file(request.param)


def test_every_measured_device_has_a_budget() -> None:
    assert MEASURED
    for path in MEASURED:
        assert path.parent.name in BUDGETS, f"add {path.parent.name} to budgets.yaml"


def test_step_time_within_budget(report: DeviceReport) -> None:
    budget = BUDGETS[report.device]
    stats = report.step_stats
    assert not report.skipped, report.skipped
    assert len(report.rows) >= budget["min_cases"]
    assert stats["mape"] <= budget["step_mape"], stats
    assert stats["max_abs_error"] <= budget["step_max_abs_error"], stats


def test_device_bound_steps_within_budget(report: DeviceReport) -> None:
    """Cases the device paces: the GPU model's own error, apart from the host's speed."""
    budget = BUDGETS[report.device].get("device_bound_step_mape")
    if budget is not None:
        assert report.step_stats_where(host_bound=False)["mape"] <= budget


def test_layers_within_budget(report: DeviceReport) -> None:
    budget = BUDGETS[report.device]
    stats = report.layer_stats
    assert stats["mape"] <= budget["layer_mape"], stats


def test_peak_memory_within_budget(report: DeviceReport) -> None:
    budget = BUDGETS[report.device]
    stats = report.memory_stats
    if budget.get("peak_memory_mape") is None:
        assert math.isnan(stats["mape"])  # not measured on this device (a CPU)
    else:
        assert stats["mape"] <= budget["peak_memory_mape"], stats


def test_ranking_of_cases_within_budget(report: DeviceReport) -> None:
    agreement = report.to_dict()["ranking_agreement"]
    assert agreement >= BUDGETS[report.device]["min_ranking_agreement"]


def test_repeat_runs_are_found_and_their_spread_reported() -> None:
    """Repeat runs of a device on other leases (models-run<N>.json) are validated beside
    models.json, and the report says how far apart the runs measured: the GPU's own work
    repeats closely between leases, the host's does not."""
    from gpusim.validate.compare import run_spread, validate_all

    reports = validate_all(device="h100-sxm", runs=True)
    assert reports[0].source.rsplit("/", 1)[-1] == "models.json"
    assert len(reports) >= 2
    spread = run_spread(reports)["h100-sxm"]
    assert spread["runs"]["count"] == len(reports)
    assert spread["device_bound"]["median"] < 0.03
    assert spread["host_bound"]["median"] > spread["device_bound"]["median"]
    assert len(validate_all(device="h100-sxm")) == 1  # by default, models.json alone


def test_layer_errors_are_summarised_by_kind() -> None:
    """Where the GPU model is off, by kind of work: the device-bound cases' layer rows per
    (kind, phase), time-weighted, in the report and its JSON."""
    report = validate_file(results.measurements_dir() / "h100-sxm" / "models.json")
    kinds = report.layer_kind_errors()
    assert ("linear", "backward") in kinds and ("linear", "forward") in kinds
    rows, error, _ = kinds[("linear", "backward")]
    assert rows > 100 and -0.5 < error < 0.5
    assert report.to_dict()["layer_kinds"]


def test_a_layer_timed_alone_waits_for_its_backward_call() -> None:
    """The suites time a layer's backward as one backward() from an idle GPU: nothing runs
    before the autograd engine has started, so a device-heavy layer takes that call's host
    time plus its kernels; a host-heavy one its host time; a looped call the slower side."""
    from gpusim.validate.compare import LayerTiming

    heavy = LayerTiming(((200e-6, 600e-6), (20e-6, 300e-6)), lead_s=120e-6)
    assert heavy.seconds(True, looped=False) == pytest.approx(1020e-6)
    assert heavy.seconds(True, looped=True) == pytest.approx(900e-6)
    light = LayerTiming(((200e-6, 10e-6), (20e-6, 5e-6)), lead_s=120e-6)
    assert light.seconds(True, looped=False) == pytest.approx(340e-6)
    assert light.seconds(True, looped=False, first_host_s=50e-6) == pytest.approx(390e-6)
    assert light.seconds(False, looped=False) == pytest.approx(355e-6)  # a CPU: in turn
