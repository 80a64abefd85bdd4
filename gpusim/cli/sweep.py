"""`gpusim sweep`: what-if grids, every combination of varied settings estimated."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpusim import numbers, paths
from gpusim.cli import flags
from gpusim.cli.console import show
from gpusim.errors import InvalidConfig
from gpusim.explore import values
from gpusim.explore.sweep import MAX_POINTS, METRICS, SweepResult, sweep
from gpusim.plan.job import OPTIMIZERS
from gpusim.progress import ProgressBar
from gpusim.tables import ranked_points, sweep_table

# Flags that are estimate() keywords under the same name (dashes for underscores).
_JOB_FLAGS = ("model", "gpu", "batch_size", "precision", "epochs", "dataset_size", "tokens",
              "steps", "seq_len", "grad_accum", "optimizer", "checkpointing", "loader_workers")


def add_job_flags(p: argparse.ArgumentParser) -> None:
    """The job, as ``gpusim estimate`` takes it; every flag is optional so it can be varied
    instead, and a flag left out takes estimate()'s default."""
    p.add_argument("--model", help="zoo name (gpusim models list) or a model YAML file")
    p.add_argument("--gpu", help="GPU or CPU profile name or alias, or a YAML file")
    p.add_argument("--batch-size", type=numbers.count, help="samples per optimizer step")
    flags.add_precision_flag(p)
    flags.add_run_length_flags(p)
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


def _best_line(result: SweepResult, metric: str) -> str | None:
    ranked = ranked_points(result, metric)
    if not ranked:
        return None
    best = ranked[0]
    where = ", ".join(f"{f}={best[f]}" for f in result.fields)
    value = best[metric]
    return f"best {metric}: {value:.4g} at {where}" if isinstance(value, float) else \
        f"best {metric}: {value} at {where}"


def run_sweep(args: argparse.Namespace) -> int:
    vary = dict(values.parse_assignment(text, "--vary") for text in args.vary)
    if len(vary) != len(args.vary):
        raise InvalidConfig("a field is given to --vary twice; give all its values "
                                   "in one --vary")
    vary_values = {name: values.parse_values(spec) for name, spec in vary.items()}
    resumed: list[int] = []

    def report(done: int, total: int) -> None:
        if not resumed:
            resumed.append(done)
            if done:
                print(f"resuming: {done} of {total} points already done")
        bar(done, total)

    try:
        with ProgressBar("sweep", unit="points") as bar:
            result = sweep(job_settings(args), vary_values, out=args.out,
                           workers=args.workers, executor=args.executor,
                           scheduler=args.scheduler, progress=report,
                           max_points=args.max_points)
    except KeyboardInterrupt:
        saved = f"; finished points are in {args.out}: run the same command to resume" \
            if args.out else ""
        print(f"\ngpusim: sweep interrupted{saved}", file=sys.stderr)
        return 130
    ran = len(result.rows) - result.resumed
    print(f"sweep: {len(result.rows)} points ({ran} run, {result.resumed} resumed, "
          f"{result.infeasible} do not run) in {bar.elapsed_s:.1f} s", file=sys.stderr)
    show(sweep_table(result, args.metric))
    best = _best_line(result, args.metric)
    if best:
        print(best)
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
