"""Results as tables for people, with rich: the command line prints them, and a notebook
shows them as they are (``display(compare_table(rows))``) or through ``rich.print``.

Every header names its unit. Cells are plain text (a ``[`` in a name is not markup).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpusim import units

if TYPE_CHECKING:
    from gpusim.explore.compare import Comparison
    from gpusim.explore.scaling import ScalingRow
    from gpusim.explore.sweep import SweepResult

# The metrics where more is better (a sweep ranks them from the top).
HIGHER_IS_BETTER = frozenset({"samples_per_s", "tokens_per_s", "mfu"})
SWEEP_TABLE_ROWS = 50  # longer sweeps show their best 10 points; the results file has all


def new_table(columns: Sequence[str], *, title: str | None = None,
              left: Iterable[str] = ()) -> Table:
    """A table in the house style: a rule under the header, numbers to the right (columns
    named in ``left`` to the left), long text folded rather than cut."""
    table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False,
                  show_edge=False)
    keep_left = set(left)
    for name in columns:
        table.add_column(name, justify="left" if name in keep_left else "right",
                         overflow="fold")
    return table


def add_row(table: Table, cells: Iterable[Any]) -> None:
    table.add_row(*(Text(str(c)) for c in cells))


def render(table: Table, width: int | None = None) -> str:
    """The table as plain text (no colour), as wide as it needs unless ``width`` is given."""
    console = Console(width=width or 10_000, color_system=None, highlight=False,
                      file=io.StringIO())
    console.print(table)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return "\n".join(line.rstrip() for line in text.splitlines())


def money(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"${value:,.0f}" if value >= 100 else f"${value:,.2f}"


def compare_table(rows: Sequence[Comparison]) -> Table:
    """compare's ranking: one row per device (or devices that cannot run it, and why)."""
    table = new_table(["#", "device", "n", "time to train", "samples/s", "cloud cost",
                       "cost to own", "energy (kWh)", "samples/$", "samples/s/kW", "fits as"],
                      left=("device", "fits as"))
    for i, row in enumerate(rows, 1):
        if not row.fits:
            add_row(table, [i, row.device.name, row.num_devices, "does not run", "", "", "",
                            "", "", "", row.reason])
            continue
        j = row.to_json()
        per_usd = j.get("samples_per_usd")
        add_row(table, [
            i, row.device.name, row.num_devices, units.human_seconds(j["time_to_train_s"]),
            f"{j['samples_per_s']:,.1f}", money(j["cost_usd"]),
            money(j["ownership_cost_usd"]), f"{j['energy_kwh']:,.1f}",
            f"{per_usd:,.0f}" if per_usd else "n/a", f"{j['samples_per_s_per_kw']:,.1f}",
            row.setup + ("; memory tight!" if row.tight else "")])
    return table


def _sweep_cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def ranked_points(result: SweepResult, metric: str) -> list[dict[str, Any]]:
    """The points with a value of ``metric``, best first."""
    return sorted((r for r in result.rows if r[metric] is not None), key=lambda r: r[metric],
                  reverse=metric in HIGHER_IS_BETTER)


def sweep_table(result: SweepResult, metric: str) -> Table:
    """Every point of a sweep (the best 10 of a long one) with ``metric``."""
    rows = list(result.rows)
    title = None
    if len(rows) > SWEEP_TABLE_ROWS:
        rows = ranked_points(result, metric)[:10]
        title = f"best 10 of {len(result.rows)} points by {metric}:"
    table = new_table([*result.fields, metric, "fits", "error"], title=title,
                      left=(*result.fields, "fits", "error"))
    for r in rows:
        add_row(table, [*(_sweep_cell(r[c]) for c in (*result.fields, metric, "fits")),
                        (r["error"] or "")[:80]])
    return table


# What the ! beside a plan's memory means (search, compare).
TIGHT_NOTE = ("! fits only if its tensors fragment less than most runs' do (short of memory "
              "at the median fragmentation); `gpusim memory` shows the margin")


def search_table(rows: Sequence[dict[str, Any]]) -> Table:
    """search's ranking: rows as ``RankedConfig.to_json`` gives them; a * marks a
    closed-form time, not simulated, a ! a plan that fits only if it fragments little."""
    table = new_table(["#", "TP", "CP", "EP", "PP", "DP", "mb", "schedule", "ZeRO", "SP",
                       "recompute", "step", "MFU", "mem/GPU", "$/step"],
                      left=("schedule", "recompute"))
    for i, r in enumerate(rows, 1):
        sched = r["schedule"] + (f" v{r['virtual_stages']}" if r["virtual_stages"] > 1 else "")
        usd = r["cost_per_step_usd"]
        cost = "n/a" if usd is None else f"{usd:.2f}" if usd >= 0.01 else f"{usd:.2g}"
        add_row(table, [
            i, r["tp"], r["cp"], r["ep"], r["pp"], r["dp"], r["microbatch_size"], sched,
            r["zero"], "yes" if r["sequence_parallel"] else "no", r["recompute"],
            units.human_seconds(r["step_time_s"]) + ("" if r["simulated"] else "*"),
            f"{100 * r['mfu']:.1f}%", units.human_bytes(r["peak_memory_per_gpu_bytes"])
            + ("!" if r["memory_tight"] else ""),
            cost])
    return table


def _number(value: float | None, scale: float = 1.0, spec: str = ",.1f") -> str:
    return "-" if value is None else format(value * scale, spec)


def scaling_table(rows: Sequence[ScalingRow]) -> Table:
    """scaling's rows: throughput and efficiency at each GPU count."""
    table = new_table(["GPUs", "batch (samples)", "step (ms)", "samples/s", "tokens/s",
                       "efficiency (%)"])
    for r in rows:
        add_row(table, [r.num_gpus, r.batch_size, _number(r.step_time_s, 1e3, ",.2f"),
                        _number(r.samples_per_s), _number(r.tokens_per_s, spec=",.0f"),
                        _number(r.efficiency, 100)])
    return table
