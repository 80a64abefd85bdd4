"""Whether a job fits: against what the driver gives a process (a little less than the
datasheet's capacity), less what the caching allocator strands in fragments when memory runs
short (issue 14)."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest
import yaml

from gpusim.data import data_dir
from gpusim.errors import OutOfMemory
from gpusim.estimation import build_job, estimate
from gpusim.explore.values import with_fields
from gpusim.hardware.catalog import load_gpu
from gpusim.plan.memory import (
    STRANDED_AT_OOM,
    STRANDED_LOWER_QUARTILE,
    STRANDED_UPPER_QUARTILE,
    memory_plan,
)
from gpusim.plan.memory_report import memory_report

OOM_MESSAGES = data_dir("measurements") / "published" / "oom_fragmentation.yaml"


def _stranded_ratios() -> list[float]:
    """reserved-but-unallocated over allocated, in the training runs' OOM messages that
    state both (PyTorch 2.1's wording) and are not excluded in the file."""
    messages = yaml.safe_load(OOM_MESSAGES.read_text())["messages"]
    return [m["reserved_unallocated_gib"] / m["allocated_by_pytorch_gib"] for m in messages
            if m["format"] == "torch>=2.1" and str(m["workload"]).startswith("training")
            and "excluded" not in m]


def test_the_stranded_fraction_is_the_median_of_the_published_oom_messages() -> None:
    ratios = _stranded_ratios()
    assert len(ratios) >= 20
    assert pytest.approx(statistics.median(ratios), abs=5e-4) == STRANDED_AT_OOM
    lower, _, upper = statistics.quantiles(ratios, n=4, method="inclusive")
    assert pytest.approx(lower, abs=5e-5) == STRANDED_LOWER_QUARTILE
    assert pytest.approx(upper, abs=5e-4) == STRANDED_UPPER_QUARTILE


@pytest.mark.parametrize(("stranded", "fits", "tight"), [
    (0.003, False, False),  # short even if it fragments less than three runs in four
    (0.010, True, True),  # short at the median, fits below it: tight, not refused
    (0.040, True, True),  # fits at the median, not at the upper quartile
    (0.070, True, False),
])
def test_a_job_is_refused_only_when_it_would_not_fit_fragmenting_little(
        stranded: float, fits: bool, tight: bool) -> None:
    job, _ = build_job("gpt2", "h100-sxm", 8, precision="bf16")
    plan = memory_plan(job)
    room = replace(plan, capacity=plan.peak_bytes * (1 + stranded)
                   + plan.outside_allocator_bytes)
    assert (room.fits, room.tight) == (fits, tight)
    assert (room.free_bytes < 0) == (stranded < STRANDED_AT_OOM)


def test_a_job_needs_its_peak_what_is_stranded_and_the_context() -> None:
    job, _ = build_job("gpt2", "h100-sxm", 8, precision="bf16")
    plan = memory_plan(job)
    assert plan.stranded_bytes == pytest.approx(STRANDED_AT_OOM * plan.peak_bytes)
    assert plan.required_bytes == pytest.approx(
        plan.peak_bytes + plan.stranded_bytes + plan.framework_reserved)
    assert sum(plan.breakdown().values()) == pytest.approx(plan.required_bytes)
    assert plan.usable_bytes == load_gpu("h100-sxm").usable_memory_bytes


def test_the_driver_reserve_lowers_what_a_process_can_use() -> None:
    h100 = load_gpu("h100-sxm")
    more = with_fields(h100, {"driver_reserved_mib": (h100.driver_reserved_mib or 0) + 1024})
    assert h100.usable_memory_bytes - more.usable_memory_bytes == 2**30
    job, _ = build_job("gpt2", more, 8, precision="bf16")
    assert memory_plan(job).usable_bytes == more.usable_memory_bytes


def test_a_what_if_memory_below_the_driver_reserve_leaves_nothing_usable() -> None:
    small = with_fields(load_gpu("h100-sxm"), {"memory_gib": 0.5})
    assert small.usable_memory_bytes == 0.0
    with pytest.raises(OutOfMemory, match="0 B usable"):
        estimate("mnist-mlp", small, 32, precision="bf16", loader_workers=0)


def test_the_memory_report_names_what_the_driver_gives() -> None:
    job, _ = build_job("gpt2", "h100-sxm", 8, precision="bf16")
    text = memory_report(job).summary()
    assert "what the driver gives a process" in text
    assert "allocator stranded" in text


def test_a_job_between_the_median_and_the_upper_quartile_is_tight() -> None:
    """ColossalAI's published GPT-2 XL run under DDP on 40 GB A100s (37.0 GiB allocated,
    within 1% of gpusim's peak) trained: it fits, but within the allocator's fragmentation
    range, and the report says so."""
    from gpusim.validate.published_memory import load_cases

    (case,) = [c for c in load_cases()
               if c.id == "colossalai_pl_gpt2xl_ddp_amp_fp16_4xa100_40gb_mb6"]
    report = memory_report(case.job)
    assert report.plan.fits and report.plan.tight
    assert report.to_json()["tight"] is True
    assert "fits, tightly" in report.summary()
    small, _ = build_job("gpt2", "h100-sxm", 8, precision="bf16")
    assert memory_plan(small).fits and not memory_plan(small).tight



def test_search_and_compare_mark_a_plan_that_fits_only_if_it_fragments_little(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A plan short of memory at the median fragmentation but within the lower quartile's
    is kept, and search's and compare's tables and JSON say it is tight."""
    from gpusim.cli import main
    from gpusim.explore.compare import compare
    from gpusim.explore.search import Ranked
    from gpusim.plan.parallel_job import ParallelConfig
    from gpusim.tables import TIGHT_NOTE, search_table

    tight = estimate("gpt2-large", "a100-80gb", 29, precision="bf16")
    assert tight.step.memory_free_bytes is not None and tight.step.memory_free_bytes < 0
    (row,) = compare("gpt2-large", ["a100-80gb"], batch_size=29, precision="bf16")
    assert row.fits and row.to_json()["memory_tight"] is True
    (roomy,) = compare("gpt2-large", ["a100-80gb"], batch_size=8, precision="bf16")
    assert roomy.to_json()["memory_tight"] is False
    assert main(["compare", "--model", "gpt2-large", "--gpus", "a100-80gb",
                 "--batch-size", "29", "--precision", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "memory tight!" in out and TIGHT_NOTE in out

    ranked = Ranked(ParallelConfig(data=1, microbatch_size=29), "none", 1.0, True, 7e10, 0.4,
                    tight=True)
    cells = ranked.to_json(batch=29, tokens=1024, usd_per_gpu_hour=None, num_gpus=1)
    assert cells["memory_tight"] is True
    (memory,) = search_table([cells]).columns[13].cells
    assert str(memory).endswith("!")
