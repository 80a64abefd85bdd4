"""Commands that explore many estimates at once: sweep (what-if grids).

Each command adds its parser in ``add_parsers`` and its handler to ``HANDLERS``; the job
flags they share (``--model``, ``--gpu``, ...) come from ``add_job_flags`` and
``job_settings``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

from gpusim import numbers, paths
from gpusim.errors import InvalidConfig
from gpusim.explore import values
from gpusim.explore.sweep import MAX_POINTS, METRICS, SweepResult, sweep
from gpusim.plan.job import OPTIMIZERS, TRAINING_PRECISIONS

# Flags that are estimate() keywords under the same name (dashes for underscores).
_JOB_FLAGS = ("model", "gpu", "batch_size", "precision", "epochs", "dataset_size", "tokens",
              "steps", "seq_len", "grad_accum", "optimizer", "checkpointing", "loader_workers")
_LOWER_IS_WORSE = frozenset({"samples_per_s", "tokens_per_s", "mfu"})
_TABLE_ROWS = 50  # longer sweeps print their best points only; the file has them all


def add_run_length_flags(p: argparse.ArgumentParser) -> None:
    """--epochs/--dataset-size, --tokens or --steps: how long the run is."""
    length = p.add_argument_group("run length (one of; default one step)")
    length.add_argument("--epochs", type=numbers.positive,
                        help="epochs over --dataset-size samples")
    length.add_argument("--dataset-size", type=numbers.count, help="samples per epoch")
    length.add_argument("--tokens", type=numbers.positive, help="training tokens (language models)")
    length.add_argument("--steps", type=numbers.count, help="optimizer steps")


def add_job_flags(p: argparse.ArgumentParser) -> None:
    """The job, as ``gpusim estimate`` takes it; every flag is optional so it can be varied
    instead, and a flag left out takes estimate()'s default."""
    p.add_argument("--model", help="zoo name (gpusim models list) or a model YAML file")
    p.add_argument("--gpu", help="GPU or CPU profile name or alias, or a YAML file")
    p.add_argument("--batch-size", type=numbers.count, help="samples per optimizer step")
    p.add_argument("--precision", choices=TRAINING_PRECISIONS)
    add_run_length_flags(p)
    p.add_argument("--seq-len", type=numbers.count, help="sequence length (language models)")
    tech = p.add_argument_group("training techniques")
    tech.add_argument("--grad-accum", type=numbers.count, help="microbatches per optimizer step")
    tech.add_argument("--optimizer", choices=OPTIMIZERS)
    tech.add_argument("--checkpointing", help="activation checkpointing (none, full, ...)")
    tech.add_argument("--freeze", help="comma-separated layer-name prefixes to freeze")
    tech.add_argument("--loader-workers", type=numbers.count0,
                      help="data-loader worker processes; 0 for synthetic data on the device")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="any other estimate() keyword or gpu.FIELD, fixed (repeatable)")


def job_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The keywords the job flags gave (flags left out are left to estimate's defaults)."""
    base = {k: getattr(args, k) for k in _JOB_FLAGS if getattr(args, k) is not None}
    if args.freeze:
        base["frozen"] = tuple(p for p in args.freeze.split(",") if p)
    for text in args.set:
        name, spec = values.parse_assignment(text, "--set")
        base[name] = values.parse_scalar(spec)
    return base


def add_parsers(sub: Any) -> None:
    s = sub.add_parser(
        "sweep", help="what-if sweeps: estimate every combination of varied settings",
        description="Estimate a job at every combination of the --vary values (in parallel), "
                    "write one row per point, and plot a metric. Points that do not fit or "
                    "cannot run are recorded with fits=false and their error. Re-running with "
                    "the same --out resumes: points already in the file are skipped (matched "
                    "by their varied values; use a new --out after changing a fixed flag).",
        epilog="example: gpusim sweep --model resnet50 --gpu h100-sxm --batch-size 256 "
               "--precision bf16 --vary gpu.memory_bandwidth_gb_s=1000:4000:7 "
               "--vary precision=fp16,bf16,fp8 --out sweep.csv --plot sweep.png")
    add_job_flags(s)
    s.add_argument("--vary", action="append", required=True, metavar="NAME=VALUES",
                   help="an estimate() keyword (batch_size, precision, seq_len, ...) or a "
                        "profile field gpu.FIELD (gpu.memory_bandwidth_gb_s, "
                        "gpu.matrix_tflops.bf16, ...) and its values: START:STOP:COUNT, "
                        "START:STOP:COUNT:log, or x,y,z; repeat for the cartesian product")
    out = s.add_argument_group("output")
    out.add_argument("--out", metavar="FILE", type=paths.output_file(".csv", ".json", ".jsonl"),
                     help="results, .csv, .json or .jsonl; written "
                                                   "point by point, and resumed from")
    out.add_argument("--plot", metavar="FILE", type=paths.figure,
                     help="write a PNG/SVG/PDF of --metric")
    out.add_argument("--metric", default="step_time_s",
                     choices=[m for m in METRICS if m not in ("fits", "error")],
                     help="what the plot and the table show (default step_time_s)")
    run = s.add_argument_group("where points run")
    run.add_argument("--workers", type=numbers.count, help="local processes (default: every CPU)")
    run.add_argument("--max-points", type=numbers.count, default=MAX_POINTS,
                     help=f"refuse grids of more points than this (default {MAX_POINTS:,}: "
                          f"about ten minutes of work)")
    run.add_argument("--executor", default="local", choices=("local", "dask", "ray"),
                     help="dask or ray: an existing cluster, whose workers have gpusim "
                          "installed (pip install dask[distributed] or ray here too)")
    run.add_argument("--scheduler", metavar="ADDRESS",
                     help="the Dask scheduler or Ray cluster address (Ray default: auto)")


class _ProgressBar:
    """A one-line bar on stderr when it is a terminal; a summary line when it is not."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self.start = time.perf_counter()
        self.first = True

    def __call__(self, done: int, total: int) -> None:
        if self.first and done:
            print(f"resuming: {done} of {total} points already done")
        self.first = False
        if self.live:
            filled = round(30 * done / total) if total else 30
            self.stream.write(f"\rsweep [{'#' * filled}{'.' * (30 - filled)}] {done}/{total} "
                              f"points  {time.perf_counter() - self.start:.1f} s")
            self.stream.flush()

    def finish(self, result: SweepResult) -> None:
        if self.live:
            self.stream.write("\n")
        ran = len(result.rows) - result.resumed
        self.stream.write(f"sweep: {len(result.rows)} points ({ran} run, {result.resumed} "
                          f"resumed, {result.infeasible} do not run) in "
                          f"{time.perf_counter() - self.start:.1f} s\n")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _table(result: SweepResult, metric: str) -> list[str]:
    rows = list(result.rows)
    ranked = sorted((r for r in rows if r[metric] is not None), key=lambda r: r[metric],
                    reverse=metric in _LOWER_IS_WORSE)
    head = ""
    if len(rows) > _TABLE_ROWS:
        rows = ranked[:10]
        head = f"best 10 of {len(result.rows)} points by {metric}:"
    columns = [*result.fields, metric, "fits", "error"]
    cells = [[_cell(r[c]) if c != "error" else (r[c] or "")[:80] for c in columns]
             for r in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    lines = [head] if head else []
    lines.append("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    lines += ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
              for line in cells]
    if ranked:
        best = ranked[0]
        where = ", ".join(f"{f}={best[f]}" for f in result.fields)
        lines.append(f"best {metric}: {_cell(best[metric])} at {where}")
    return lines


def run_sweep(args: argparse.Namespace) -> int:
    vary = dict(values.parse_assignment(text, "--vary") for text in args.vary)
    if len(vary) != len(args.vary):
        raise InvalidConfig("a field is given to --vary twice; give all its values "
                                   "in one --vary")
    vary_values = {name: values.parse_values(spec) for name, spec in vary.items()}
    bar = _ProgressBar(sys.stderr)
    try:
        result = sweep(job_settings(args), vary_values, out=args.out, workers=args.workers,
                       executor=args.executor, scheduler=args.scheduler, progress=bar,
                       max_points=args.max_points)
    except KeyboardInterrupt:
        saved = f"; finished points are in {args.out}: run the same command to resume" \
            if args.out else ""
        print(f"\ngpusim: sweep interrupted{saved}", file=sys.stderr)
        return 130
    bar.finish(result)
    print("\n".join(_table(result, args.metric)))
    for field in result.inert_fields():
        print(f"note: {field} changed no result: this job does not use it"
              + (f" ({values.DESCRIPTIVE[field[len(values.GPU_PREFIX):]]})"
                 if field[len(values.GPU_PREFIX):] in values.DESCRIPTIVE else ""))
    if args.out:
        print(f"results written to {args.out}")
    if args.plot:
        from gpusim.plotting.sweep import sweep_figure

        sweep_figure(result, args.metric).savefig(args.plot, dpi=120)
        print(f"plot written to {args.plot}")
    return 0


HANDLERS = {"sweep": run_sweep}
