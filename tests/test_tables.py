"""Tables and progress bars (rich): what the command line and notebooks show."""

from __future__ import annotations

import io
import time

import pytest

from gpusim.explore.compare import compare
from gpusim.explore.scaling import ScalingRow
from gpusim.progress import ProgressBar
from gpusim.tables import add_row, compare_table, new_table, render, scaling_table


def test_compare_table_names_units_and_keeps_brackets_as_text() -> None:
    rows = compare("mnist-mlp", ["h100-sxm", "t4"], batch_size=64, steps=10,
                   loader_workers=0)
    text = render(compare_table(rows))
    lines = text.splitlines()
    for header in ("time to train", "samples/s", "cloud cost", "energy (kWh)", "fits as"):
        assert header in lines[0]
    assert "h100-sxm" in text and "t4" in text
    assert all(line == line.rstrip() for line in lines)


def test_a_cell_with_brackets_is_not_markup() -> None:
    table = new_table(["name", "note"], left=("name", "note"))
    add_row(table, ["[bold]x[/bold]", "[red]"])
    text = render(table)
    assert "[bold]x[/bold]" in text and "[red]" in text
    row = ScalingRow(8, 64, None, None, None, None, False, "does not split")
    assert render(scaling_table([row])).splitlines()[-1].split()[-1] == "-"


def test_progress_in_a_log_is_a_line_with_the_time_left() -> None:
    log = io.StringIO()
    with ProgressBar("sweep", unit="points", stream=log, log_every_s=0.0) as bar:
        assert not bar.live  # a StringIO is no terminal: no bar redrawn in place
        for done in range(5):
            bar(done, 10)
            time.sleep(0.01)
    lines = log.getvalue().splitlines()
    assert lines, "a log gets progress lines"
    assert lines[-1].startswith("sweep: 4 of 10 points in")
    assert "left" in lines[-1]


def test_progress_stays_quiet_in_a_log_for_short_work() -> None:
    log = io.StringIO()
    with ProgressBar("search", stream=log) as bar:
        for done in range(101):
            bar(done, 100)
    assert log.getvalue() == ""


@pytest.mark.parametrize("done", [0, 3])
def test_progress_status_counts(done: int) -> None:
    bar = ProgressBar("compare", unit="devices", stream=io.StringIO())
    bar(done, 5, "h100-sxm")
    assert bar.status(done, 5).startswith(f"compare: {done} of 5 devices in")
    bar.close()
