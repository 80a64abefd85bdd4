"""Device comparison, budget mode, pricing and energy: what a buyer reads off the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpusim import units
from gpusim.cli import main
from gpusim.cost.energy import active_seconds, average_power_w
from gpusim.cost.kernels import kernel_cost
from gpusim.errors import GpusimError
from gpusim.estimation import estimate
from gpusim.explore.compare import affordable, budget, compare
from gpusim.hardware.calibration import calibration_for
from gpusim.hardware.catalog import load_device
from gpusim.plan.job import auto_precision
from gpusim.plotting.compare import pareto_front
from gpusim.pricing import HOURS_PER_YEAR, Pricing, run_cost
from gpusim.workload.ops import GemmShape, gemm_op

JSON_FIELDS = {"gpu", "samples_per_s", "time_to_train_s", "cost_usd", "ownership_cost_usd",
               "energy_kwh", "fits"}


# --- energy from utilization ------------------------------------------------------------

def test_a_large_gemm_is_active_nearly_all_its_time_and_a_tiny_one_is_not() -> None:
    h100 = load_device("h100-sxm")
    cal = calibration_for(h100)
    big = kernel_cost(gemm_op("big", GemmShape(8192, 8192, 8192), "bf16", 2), h100, cal)
    tiny = kernel_cost(gemm_op("tiny", GemmShape(16, 16, 16), "bf16", 2), h100, cal)
    assert active_seconds(big) / big.seconds > 0.95
    assert active_seconds(tiny) / tiny.seconds < 0.2


def test_power_runs_from_idle_to_tdp() -> None:
    h100 = load_device("h100-sxm")
    cal = calibration_for(h100)
    assert average_power_w(h100, cal, 0.0) == pytest.approx(cal.idle_power_fraction * 700)
    assert average_power_w(h100, cal, 1.0) == pytest.approx(700)
    assert average_power_w(h100, cal, 2.0) == pytest.approx(700)  # clipped


def test_a_host_bound_job_draws_less_power_than_its_busy_share_suggests() -> None:
    # The MNIST MLP's kernels are tiny: the stream is often busy but rarely at a roof.
    small = estimate("mnist-mlp", "h100-sxm", 64, loader_workers=0)
    big = estimate("gpt2-medium", "h100-sxm", 16, precision="bf16", loader_workers=0)
    assert small.step.active_fraction < 0.5 * small.step.busy_fraction
    assert big.step.active_fraction > 0.9
    assert small.average_power_w < big.average_power_w <= 700


def test_energy_counts_every_gpu_of_a_parallel_job() -> None:
    one = estimate("gpt2", "h100-sxm", 16, precision="bf16", steps=10, loader_workers=0)
    eight = estimate("gpt2", "h100-sxm", 128, precision="bf16", steps=10, num_gpus=8)
    assert 0 < eight.step.active_fraction <= 1
    per_gpu_kwh = units.to_kwh(eight.average_power_w * eight.time_to_train_s)
    assert eight.energy_kwh == pytest.approx(8 * per_gpu_kwh)
    assert eight.energy_kwh > one.energy_kwh


# --- pricing ------------------------------------------------------------------------------

def test_ownership_spreads_the_purchase_over_the_lifetime() -> None:
    h100 = load_device("h100-sxm")
    quote = h100.purchase_price()
    assert quote is not None
    run = estimate("gpt2", h100, 16, precision="bf16", steps=1000, loader_workers=0)
    pricing = Pricing(electricity_usd_per_kwh=0.10, pue=1.5, lifetime_years=4, utilization=0.5)
    cost = run_cost(run, h100, pricing)
    hours = run.time_to_train_s / 3600
    assert cost.amortized_purchase_usd == pytest.approx(
        quote.usd * hours / (4 * HOURS_PER_YEAR * 0.5))
    assert cost.facility_energy_kwh == pytest.approx(1.5 * run.energy_kwh)
    assert cost.electricity_usd == pytest.approx(0.15 * run.energy_kwh)
    assert cost.ownership_usd == pytest.approx(cost.amortized_purchase_usd + cost.electricity_usd)
    assert cost.cloud_usd == run.cost_usd


def test_hosts_add_to_the_purchase_and_lower_use_raises_the_share() -> None:
    h100 = load_device("h100-sxm")
    run = estimate("gpt2", h100, 16, precision="bf16", steps=100, loader_workers=0)
    plain = run_cost(run, h100, Pricing())
    hosted = run_cost(run, h100, Pricing(host_usd_per_gpu=10_000, utilization=0.5))
    assert hosted.purchase_usd == pytest.approx(plain.purchase_usd + 10_000)
    assert hosted.amortized_purchase_usd > 2 * plain.amortized_purchase_usd


def test_pricing_rejects_impossible_facilities() -> None:
    with pytest.raises(ValueError):
        Pricing(pue=0.9)
    with pytest.raises(ValueError):
        Pricing(utilization=0)


# --- compare ------------------------------------------------------------------------------

def test_auto_precision_follows_the_matrix_units() -> None:
    assert auto_precision(load_device("h100-sxm")) == "bf16"
    assert auto_precision(load_device("v100-sxm2-32gb")) == "fp16"
    assert auto_precision(load_device("gtx-1080-ti")) == "fp32"


def test_compare_ranks_by_time_and_a_newer_gpu_wins() -> None:
    rows = compare("gpt2", ["t4", "h100-sxm", "a100-80gb"], batch_size=16, steps=100,
                   seq_len=1024, loader_workers=0)
    assert [r.device.name for r in rows] == ["h100-sxm", "a100-80gb", "t4"]
    times = [r.time_to_train_s for r in rows]
    assert times == sorted(times)
    for row in rows:
        data = row.to_json()
        assert data.keys() >= JSON_FIELDS
        assert data["fits"] is True
        assert data["samples_per_s"] * data["time_to_train_s"] == pytest.approx(100 * 16)


def test_compare_by_cost_can_reorder() -> None:
    rows = compare("resnet50", ["h100-sxm", "a100-80gb", "t4", "rtx-4090"], batch_size=128,
                   steps=100, loader_workers=0, sort="cost")
    costs = [r.value("cost") for r in rows if r.value("cost") is not None]
    assert costs == sorted(costs)


def test_a_job_too_big_for_one_device_accumulates_or_recomputes() -> None:
    rows = compare("gpt2-medium", ["rtx-4090"], batch_size=64, steps=10, seq_len=1024,
                   loader_workers=0)
    (row,) = rows
    assert row.fits
    assert "accumulated" in row.setup or "recompute" in row.setup
    assert row.result is not None and row.result.batch_size == 64


def test_what_does_not_fit_stays_in_the_table_with_the_reason() -> None:
    rows = compare("gpt2-xl", ["t4", "h100-sxm"], batch_size=8, steps=1, seq_len=1024)
    t4 = next(r for r in rows if r.device.name == "t4")
    assert not t4.fits and "needs" in (t4.reason or "")
    assert rows[-1] is t4  # rows that do not run go last
    assert t4.to_json()["fits"] is False and t4.to_json()["time_to_train_s"] is None


def test_cpus_and_gpus_in_one_list() -> None:
    rows = compare("mnist-cnn", ["epyc-9654", "h100-sxm"], batch_size=128, epochs=1,
                   dataset_size=60000)
    assert [r.device.name for r in rows] == ["h100-sxm", "epyc-9654"]
    assert rows[1].to_json()["kind"] == "cpu" and "fp32" in rows[1].setup
    many = compare("mnist-cnn", ["epyc-9654"], num_devices=4, batch_size=128, steps=1)
    assert not many[0].fits and "CPU" in (many[0].reason or "")


def test_many_gpus_take_a_split_from_search() -> None:
    (row,) = compare("gpt2", ["h100-sxm"], num_devices=8, batch_size=64, steps=10)
    assert row.fits and row.num_devices == 8 and "DP" in row.setup
    assert row.result is not None and row.result.num_gpus == 8


# --- budget -------------------------------------------------------------------------------

def test_affordable_counts_are_powers_of_two_within_the_budget() -> None:
    h100 = load_device("h100-sxm")
    price = h100.purchase_price()
    assert price is not None
    assert affordable(h100, price.usd * 0.5, Pricing(), 64) == 0
    assert affordable(h100, price.usd * 5, Pricing(), 64) == 4
    assert affordable(h100, price.usd * 5, Pricing(), 2) == 2
    assert affordable(h100, price.usd * 5, Pricing(host_usd_per_gpu=price.usd), 64) == 2


def test_budget_mode_explains_the_winner() -> None:
    rows, why = budget("gpt2", ["h100-sxm", "rtx-4090"], 40_000, steps=10,
                       batch_size=64, max_devices=8)
    assert {r.device.name: r.num_devices for r in rows} == {"h100-sxm": 1, "rtx-4090": 8}
    assert why[0].startswith(f"best: {rows[0].num_devices} x {rows[0].device.name}")
    assert "slower" in why[1]
    for row in rows:
        assert row.cost is not None and row.cost.purchase_usd is not None
        assert row.cost.purchase_usd <= 40_000


def test_pareto_front_keeps_what_nothing_beats_on_both() -> None:
    points = [(1.0, 10.0), (2.0, 5.0), (3.0, 6.0), (4.0, 1.0), (5.0, 1.0)]
    assert pareto_front(points) == [0, 1, 3]


# --- command line -------------------------------------------------------------------------

def test_compare_cli_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "compare.png"
    assert main(["compare", "--model", "resnet50", "--gpus", "h100-sxm,t4,epyc-9654",
                 "--batch-size", "64", "--steps", "10", "--loader-workers", "0", "--json",
                 "--plot", str(png)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["gpu"] for r in data["rows"]] == ["h100-sxm", "t4", "epyc-9654"]
    assert all(r.keys() >= JSON_FIELDS for r in data["rows"])
    assert png.stat().st_size > 10_000


def test_compare_cli_table_and_budget(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--model", "resnet50", "--gpus", "h100-sxm,rtx-4090",
                 "--batch-size", "64", "--steps", "10", "--budget-usd", "20000",
                 "--max-gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "time to train" in out and "why:" in out and "best:" in out
    assert "electricity" in out and "PUE" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--gpus", "no-such-gpu"], "no-such-gpu"),
    (["--gpus", "h100-sxm", "--pue", "0.5"], "--pue"),
    (["--gpus", "h100-sxm", "--budget-usd", "-1"], "--budget-usd"),
    (["--gpus", "h100-sxm", "--num-gpus", "0"], "--num-gpus"),
])
def test_compare_cli_errors_are_one_line(argv: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    # checked by the option's parser (argparse: usage, then the error) or by the job
    try:
        code = main(["compare", "--model", "resnet50", "--steps", "1", *argv])
    except SystemExit as exc:
        code = exc.code  # type: ignore[assignment]
    assert code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in err


def test_setups_of_different_counts_in_one_table() -> None:
    rows = compare("gpt2", ["rtx-4090:8", ("h100-sxm", 2), "a100-80gb"], batch_size=64,
                   steps=10, seq_len=512, loader_workers=0)
    counts = {r.device.name: r.num_devices for r in rows}
    assert counts == {"rtx-4090": 8, "h100-sxm": 2, "a100-80gb": 1}
    assert all(r.fits for r in rows)
    assert all(r.result is not None and r.result.batch_size == 64 for r in rows)


@pytest.mark.parametrize("spec", ["h100-sxm:0", "h100-sxm:two", "h100-sxm:８"])
def test_a_bad_device_count_is_a_clear_error(spec: str) -> None:
    with pytest.raises(GpusimError, match="count"):
        compare("gpt2", [spec], steps=1)


def test_a_cluster_rents_whole_servers() -> None:
    """A 16-GPU job is priced per GPU of an 8-GPU instance, one GPU at a single-card rate."""
    gpu = load_device("h100-sxm")
    assert any(q.instance_gpus == 8 for q in gpu.cloud_prices)
    one, many = gpu.cloud_price_usd_per_hour(1), gpu.cloud_price_usd_per_hour(16)
    assert one is not None and many is not None
    assert one.instance_gpus == 1 and many.instance_gpus == 8
    assert many == min((q for q in gpu.cloud_prices if q.instance_gpus == 8),
                       key=lambda q: q.usd_per_hour)
    result = estimate("gpt2", "h100-sxm", 64, num_gpus=16, steps=1, loader_workers=0)
    assert result.price_usd_per_hour == many.usd_per_hour
    assert "8-GPU instance" in (result.price_source or "")
