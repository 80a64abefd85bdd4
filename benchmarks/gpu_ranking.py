"""Does gpusim rank GPUs by throughput as the measured runs do?

Groups the same workload measured on two or more devices, predicts every row with gpusim,
and prints per group the measured and predicted order, Kendall's tau-b, pairwise agreement
and each pair's speed ratio; then the agreement over all groups (gpusim/validate/ranking.py
says how ties count). Throughput is samples (images, sequences) per second. Sources:

- published/dev_cases.yaml, section B_single_node (NVIDIA DeepLearningExamples): rows
  of the same model, precision, per-GPU batch and GPU count on different hardware. One GPU
  is predicted as benchmarks/dev_cases.py does; several GPUs on the row's DGX (DGX-1 with its
  16 or 32 GB V100s, DGX A100), data parallel.
- Megatron-LM 2020 (gpusim/validate/megatron.py, transcribed from section A_large_scale): the
  same GPT on one DGX-2 (V100) and one DGX A100. The per-GPU batch differs (8 on DGX-2, 16 on
  DGX A100, as published), so these compare samples/s at each system's own batch.
- The project's own measurements (measurements/<device>/models.json): the cases that two or
  more devices share; any device folder that appears is picked up.

Nothing is fitted to these figures.

    python benchmarks/gpu_ranking.py [path/to/dev_cases.yaml] [--measurements DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from dev_cases import DEFAULT, GPUS, PRECISIONS, SYSTEMS, _case

from gpusim.errors import GpusimError, InvalidMeasurement
from gpusim.estimation import estimate
from gpusim.hardware.catalog import load_system
from gpusim.validate.compare import CaseRow, validate_all
from gpusim.validate.megatron import CASES, MegatronCase, predict
from gpusim.validate.ranking import RankingSummary, ThroughputRow, rank

FAR_OFF = 0.20  # a pair's predicted speed ratio this far from the measured one is flagged


@dataclass
class Collected:
    """Rows to rank, what each row ran (batch, precision), and what was left out and why."""

    rows: list[ThroughputRow] = field(default_factory=list)
    settings: dict[tuple[str, str], str] = field(default_factory=dict)  # (case, device)
    skipped: list[str] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)

    def extend(self, other: Collected) -> None:
        self.rows += other.rows
        self.settings.update(other.settings)
        self.skipped += other.skipped
        self.not_compared += other.not_compared


def _device(gpu: str, system: str | None, num_gpus: int) -> str:
    return gpu if num_gpus == 1 else f"{system or '?'} x{num_gpus} ({gpu})"


# --- DeepLearningExamples (dev_cases.yaml, B_single_node) ----------------------------------


def _dle_gpu(row: dict[str, Any]) -> str | None:
    return next((v for k, v in GPUS.items() if k in row["hardware"]), None)


def _dle_system(row: dict[str, Any]) -> str | None:
    return next((v for k, v in SYSTEMS.items() if k in row["hardware"]), None)


def _dle_device(row: dict[str, Any]) -> str:
    gpu = _dle_gpu(row)
    if gpu is None:
        return str(row["hardware"])
    return _device(gpu, _dle_system(row), int(row["num_gpus"]))


def _dle_model(row: dict[str, Any]) -> str:
    seq = row["model"].get("seq_len")
    return f"{row['model']['name']}{f' seq {seq}' if seq else ''}"


def _recipe(row: dict[str, Any]) -> str:
    """Precision and per-GPU batch, e.g. 'fp16 256/GPU' ('?' where the source gives none)."""
    par = row["parallelism"]
    batch = par.get("batch_per_gpu")
    return (f"{PRECISIONS.get(par['precision'], par['precision'])} "
            f"{batch if batch is not None else '?'}/GPU")


def _dle_case(row: dict[str, Any]) -> str:
    """The workload, without the hardware: rows with equal keys are the same job."""
    accumulated = row["parallelism"].get("accumulated_batch_per_gpu")
    acc = f" (accumulated {accumulated})" if accumulated else ""
    n = int(row["num_gpus"])
    return f"DLE {_dle_model(row)}, {_recipe(row)}{acc}, {n} GPU{'s' if n > 1 else ''}"


def _dle_predict(row: dict[str, Any]) -> tuple[float | None, str]:
    """Predicted samples/s of a row, or None and why not."""
    try:
        args, why = _case(row)
    except (ValueError, TypeError):
        return None, f"batch per GPU is not one number ({row['parallelism']['batch_per_gpu']})"
    if args is None:
        return None, why
    n = int(row["num_gpus"])
    if n > 1:
        name = _dle_system(row)
        if name is None:
            return None, f"no system profile for {row['hardware']}"
        system = load_system(name)
        if system.gpu != args["gpu"]:  # the DGX-1 with 32 GB V100s, the DGX A100 40GB
            system = system.model_copy(update={"gpu": args["gpu"]})
        args.update(batch_size=args["batch_size"] * n, num_gpus=n, system=system)
    try:
        return estimate(**args).step.samples_per_s, ""
    except GpusimError as exc:
        return None, f"infeasible: {exc}"


def _recipes(rows: list[dict[str, Any]]) -> str:
    """What each GPU ran: 'a100-80gb tf32 256/GPU, fp16 256/GPU; v100-sxm2-16gb ...'."""
    recipes: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        gpu = _dle_gpu(row) or str(row["hardware"])
        if _recipe(row) not in recipes[gpu]:
            recipes[gpu].append(_recipe(row))
    return "; ".join(f"{gpu} {', '.join(rs)}" for gpu, rs in recipes.items())


def _unpaired_note(model: str, unpaired: list[dict[str, Any]],
                   everything: list[dict[str, Any]]) -> str:
    """Why rows of ``model`` were not compared, with what each GPU ran."""
    counts = ", ".join(map(str, sorted({int(r["num_gpus"]) for r in unpaired})))
    rows = f"{len(unpaired)} rows on {counts} GPUs"
    others = [r for r in everything if all(r is not u for u in unpaired)]
    if len({_dle_gpu(r) or r["hardware"] for r in everything}) < 2:
        note = f"DLE {model} ({rows}): published on one GPU only"
    elif not others:
        note = (f"DLE {model} ({rows}): no two GPUs ran the same precision and per-GPU batch "
                f"({_recipes(unpaired)})")
    else:
        note = (f"DLE {model}, {_recipes(unpaired)} ({rows}): no other GPU ran that precision "
                f"and per-GPU batch (the compared rows ran {_recipes(others)})")
    args, skip = None, ""
    with contextlib.suppress(ValueError, TypeError):  # a batch that is not one number
        args, skip = _case(unpaired[0])
    also = f"; gpusim would skip it anyway: {skip}" if args is None and skip else ""
    if any(r["parallelism"].get("batch_per_gpu") is None for r in unpaired):
        also += "; ?: the source states no single per-GPU batch"
    return note + also


def dle_rows(path: Path) -> Collected:
    """Rows of section B_single_node that share a workload with another GPU or system."""
    out = Collected()
    by_case: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in yaml.safe_load(path.read_text())["B_single_node"]:
        by_case[_dle_case(row)].append(row)
    unpaired: dict[str, list[dict[str, Any]]] = defaultdict(list)  # by model (and seq)
    for case, rows in by_case.items():
        if len({_dle_device(r) for r in rows}) < 2:
            unpaired[_dle_model(rows[0])] += rows
            continue
        seen: set[str] = set()
        for row in rows:
            device = _dle_device(row)
            if device in seen:
                out.skipped.append(f"{row['id']}: a second row of {case} on {device}")
                continue
            seen.add(device)
            predicted, why = _dle_predict(row)
            if predicted is None:
                out.skipped.append(f"{row['id']} ({device}): {why}")
                continue
            out.rows.append(ThroughputRow(case, device, float(row["value"]), predicted))
            out.settings[(case, device)] = row["id"]
    everything: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rows in by_case.values():
        everything[_dle_model(rows[0])] += rows
    for model, rows in unpaired.items():
        out.not_compared.append(_unpaired_note(model, rows, everything[model]))
    return out


# --- Megatron-LM 2020 (gpusim/validate/megatron.py) ----------------------------------------


def _measured_step_s(case: MegatronCase) -> float:
    if case.metric == "iteration_ms":
        return case.measured / 1e3
    return case.flops_per_step() / (case.measured * 1e12 * case.num_gpus)


def megatron_rows() -> Collected:
    """The Megatron cases run on two or more systems with the same model and split."""
    out = Collected()
    groups: dict[tuple[int, ...], list[MegatronCase]] = defaultdict(list)
    for case in CASES:
        groups[(case.layers, case.hidden, case.heads, case.seq_len, case.vocab,
                case.num_gpus, case.tp, case.pp, case.dp)].append(case)
    alone: list[MegatronCase] = []
    for cases in groups.values():
        if len({c.system for c in cases}) < 2:
            alone += cases
            continue
        first = cases[0]
        tokens = [c.id.split("_") for c in cases]
        common = "_".join(t[0] for t in zip(*tokens, strict=False) if len(set(t)) == 1)
        gpus = f"{first.num_gpus} GPU{'s' if first.num_gpus > 1 else ''}"
        name = f"{common} (GPT {first.layers}L h{first.hidden}, TP{first.tp}, {gpus})"
        for case in cases:
            count = f" x{case.num_gpus}" if case.num_gpus > 1 else ""
            device = f"{case.system}{count} ({load_system(case.system).gpu})"
            step = predict(case).step
            out.rows.append(ThroughputRow(name, device, case.global_batch / _measured_step_s(case),
                                          case.global_batch / step.step_time_s))
            out.settings[(name, device)] = f"{case.id}, batch {case.microbatch}/GPU"
    if alone:
        systems = ", ".join(sorted({c.system for c in alone}))
        out.not_compared.append(f"{len(alone)} Megatron cases whose model and split ran on one "
                                f"system only (all on {systems})")
    return out


# --- the project's own measurements (measurements/<device>/models.json) --------------------


def measurement_rows(root: Path | None = None) -> Collected:
    """Cases of the committed models suite that two or more devices share."""
    out = Collected()
    try:
        reports = validate_all(root)
    except InvalidMeasurement as exc:
        out.not_compared.append(f"project measurements: {exc}")
        return out
    by_case: dict[str, list[tuple[str, CaseRow]]] = defaultdict(list)
    for rep in reports:
        out.skipped += [f"measurements {rep.device}: {note}" for note in rep.skipped]
        for case_row in rep.rows:
            by_case[case_row.id].append((rep.device, case_row))
    devices = ", ".join(rep.device for rep in reports)
    shared = {cid: rows for cid, rows in by_case.items() if len(rows) > 1}
    if len(shared) < len(by_case):
        out.not_compared.append(
            f"{len(by_case) - len(shared)} project-measured cases on one device only "
            f"(devices measured: {devices}); a ranking needs a second device")
    for cid, rows in shared.items():
        case = f"measured {cid}"
        for device, r in rows:
            out.rows.append(ThroughputRow(case, device, r.batch_size / r.measured_s,
                                          r.batch_size / r.predicted_s))
            out.settings[(case, device)] = f"{r.model}, batch {r.batch_size}, {r.precision}"
    return out


def collect(path: Path | None = DEFAULT, measurements: Path | None = None) -> Collected:
    """Every source; the dev_cases rows only when ``path`` is an existing file."""
    out = Collected()
    if path is not None and path.is_file():
        out.extend(dle_rows(path))
    else:
        out.not_compared.append(f"DeepLearningExamples rows: dev_cases.yaml not found at {path}")
    out.extend(megatron_rows())
    out.extend(measurement_rows(measurements))
    return out


# --- the report -----------------------------------------------------------------------------


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.0f}%"


def _num(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.2f}"


def format_summary(summary: RankingSummary, data: Collected) -> str:
    lines: list[str] = []
    for g in summary.groups:
        lines.append(g.case)
        lines.append(f"  {'device':40s} {'measured':>10s} {'predicted':>10s} {'error':>7s}  row")
        for r in g.rows:
            error = r.predicted_samples_per_s / r.measured_samples_per_s - 1
            lines.append(f"  {r.device:40s} {r.measured_samples_per_s:10.1f} "
                         f"{r.predicted_samples_per_s:10.1f} {100 * error:+6.1f}%  "
                         f"{data.settings.get((g.case, r.device), '')}")
        lines.append(f"  measured order:  {g.order_text('measured')}")
        lines.append(f"  predicted order: {g.order_text('predicted')}")
        scored = [p for p in g.pairs if p.agreement_score is not None]
        lines.append(f"  Kendall tau-b {_num(g.kendall_tau)}, pairwise agreement "
                     f"{_pct(g.pairwise_agreement)} "
                     f"({sum(p.agreement_score or 0 for p in scored):g} of {len(scored)})")
        for p in g.pairs:
            flag = "  <-- far off" if abs(p.ratio_error) > FAR_OFF or p.order == "disagree" \
                else ""
            lines.append(f"    {p.faster} / {p.slower}: measured {p.measured_speed_ratio:.2f}x, "
                         f"predicted {p.predicted_speed_ratio:.2f}x "
                         f"({100 * p.ratio_error:+.1f}%, {p.order}){flag}")
        lines.append("")
    for note in data.skipped:
        lines.append(f"skipped {note}")
    if not data.skipped:
        lines.append("skipped: none (every row of a compared group was predicted)")
    for note in data.not_compared:
        lines.append(f"not compared: {note}")
    pairs = summary.pairs
    scored = [p for p in pairs if p.agreement_score is not None]
    lines.append("")
    lines.append(f"{len(summary.groups)} groups, {len(pairs)} device pairs "
                 f"({len(pairs) - len(scored)} tied as measured, left out of the agreement)")
    lines.append(f"pairwise agreement {_pct(summary.pairwise_agreement)} "
                 f"({sum(p.agreement_score or 0 for p in scored):g} of {len(scored)}; a pair "
                 "the prediction ties counts 1/2)")
    defined = [g for g in summary.groups if not math.isnan(g.kendall_tau)]
    lines.append(f"mean Kendall tau-b {_num(summary.mean_kendall_tau)} over {len(defined)} "
                 f"groups ({len(summary.groups) - len(defined)} undefined: one side all tied)")
    lines.append(f"speed ratios: mean |ln(predicted / measured)| "
                 f"{summary.mean_abs_log_ratio_error:.3f} (a typical ratio off by "
                 f"{_pct(summary.typical_ratio_error)})")
    far = [(g.case, p) for g in summary.groups for p in g.pairs
           if abs(p.ratio_error) > FAR_OFF or p.order == "disagree"]
    lines.append(f"ordered wrongly or ratio off by more than {_pct(FAR_OFF)}: "
                 f"{len(far)} of {len(pairs)} pairs")
    for case, p in far:
        lines.append(f"  {case}: {p.faster} / {p.slower} measured "
                     f"{p.measured_speed_ratio:.2f}x, predicted {p.predicted_speed_ratio:.2f}x "
                     f"({100 * p.ratio_error:+.1f}%, {p.order})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("path", nargs="?", type=Path, default=DEFAULT,
                        help="dev_cases.yaml (default: published/dev_cases.yaml)")
    parser.add_argument("--measurements", type=Path, default=None,
                        help="measurements folder (default: the project's measurements/)")
    parser.add_argument("--tie-tolerance", type=float, default=0.0,
                        help="relative difference at or under which throughputs tie")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    data = collect(args.path, args.measurements)
    summary = rank(data.rows, args.tie_tolerance)
    print(format_summary(summary, data))
    print(f"({time.perf_counter() - start:.1f} s; throughput in samples/s; calibration: "
          "stated defaults, not fitted)")


if __name__ == "__main__":
    main()
