"""The validation report as text: a table per device, then the summary figures."""

from __future__ import annotations

import math

from gpusim import units
from gpusim.tables import add_row, new_table, render
from gpusim.validate.compare import DeviceReport, cross_device_ranking, run_spread


def _pct(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:+.1%}"


def _abs_pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.1%}"


def format_reports(reports: list[DeviceReport], verbose: bool = False) -> str:
    lines: list[str] = []
    for rep in reports:
        lines.append(f"{rep.device}: {len(rep.rows)} cases from {rep.source} "
                     f"(calibration {rep.calibration})")
        table = new_table(["case", "predicted", "measured", "error", "memory error"],
                          left=("case",))
        for row in rep.rows:
            add_row(table, [row.id, units.human_seconds(row.predicted_s),
                            units.human_seconds(row.measured_s), _pct(row.error),
                            _pct(row.memory_error)])
            if verbose:
                for lay in row.layers:
                    add_row(table, [f"    {lay.layer} {lay.phase}",
                                    units.human_seconds(lay.predicted_s),
                                    units.human_seconds(lay.measured_s), _pct(lay.error), ""])
        lines += ["  " + line for line in render(table).splitlines()]
        d = rep.to_dict()
        lines.append(f"  step time: MAPE {_abs_pct(d['mape'])}, p90 "
                     f"{_abs_pct(d['p90_abs_error'])}, max {_abs_pct(d['max_abs_error'])} "
                     f"({d['worst_case']})")
        for key, what in (("device_bound", "device-bound"), ("host_bound", "host-bound")):
            part = d[key]
            if part["cases"] and d["device_bound"]["cases"] and d["host_bound"]["cases"]:
                lines.append(f"    {what} ({part['cases']} cases): MAPE "
                             f"{_abs_pct(part['mape'])}, max {_abs_pct(part['max_abs_error'])}")
        layer = d["layer"]
        lines.append(f"  per layer ({d['layer_rows']} forward/backward rows): MAPE "
                     f"{_abs_pct(layer['mape'])}, p90 {_abs_pct(layer['p90_abs_error'])}")
        kinds = sorted(rep.layer_kind_errors().items(), key=lambda kv: -abs(kv[1][2]))
        if kinds:
            worst = ", ".join(f"{kind} {phase} {_pct(err)} ({n} rows)"
                              for (kind, phase), (n, err, _) in kinds[:4])
            lines.append(f"    by kind, the largest gaps in time (device-bound cases): {worst}")
        if d["phases"]:
            parts = [f"{phase} {_pct(st['mean_error'])} (MAPE {_abs_pct(st['mape'])})"
                     for phase, st in d["phases"].items()]
            lines.append("  step phases, timed inside the step (mean error): "
                         + ", ".join(parts))
        mem = d["peak_memory"]
        lines.append("  peak memory: " + ("not measured (CPU)" if math.isnan(mem["mape"])
                                          else f"MAPE {_abs_pct(mem['mape'])}, max "
                                               f"{_abs_pct(mem['max_abs_error'])}"))
        agree = d["ranking_agreement"]
        lines.append(f"  ranking: {_abs_pct(agree)} of case pairs ordered as measured")
        for note in rep.skipped:
            lines.append(f"  skipped {note}")
        lines.append("")
    for device, spread in run_spread(reports).items():
        parts = [f"{what} cases median {_abs_pct(spread[key]['median'])}, max "
                 f"{_abs_pct(spread[key]['max'])}"
                 for key, what in (("device_bound", "device-bound"),
                                   ("host_bound", "host-bound")) if key in spread]
        lines.append(f"{device}, {int(spread['runs']['count'])} runs on different leases: "
                     f"measured steps lie apart by {'; '.join(parts)}")
    across = cross_device_ranking(reports)
    if across:
        same = sum(1 for v in across.values() if v == 1.0)
        lines.append(f"across devices: {same} of {len(across)} cases rank the devices as "
                     "measured")
    return "\n".join(lines).rstrip()
