"""`gpusim compare`: rank devices on one job by time, cost to rent and own, and energy;
with --budget-usd, the best set of GPUs a budget buys."""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from gpusim import numbers, paths
from gpusim.cli import flags
from gpusim.cli.console import show
from gpusim.errors import InvalidConfig
from gpusim.explore.compare import SORT_KEYS, Comparison, budget, compare
from gpusim.hardware.catalog import catalog
from gpusim.hardware.profile import GPUProfile
from gpusim.plan.job import OPTIMIZERS
from gpusim.pricing import ELECTRICITY_USD_PER_KWH, LIFETIME_YEARS, PUE, Pricing
from gpusim.progress import ProgressBar
from gpusim.tables import TIGHT_NOTE, compare_table


def add_parsers(sub: Any) -> None:
    c = sub.add_parser(
        "compare", help="rank GPUs (and CPUs) on one job: time, cost to rent and own, energy",
        description="Train the same job (model, global batch, run length) on each device and "
                    "rank them. One device fits the job with gradient accumulation and "
                    "recomputation; many GPUs take the fastest split `gpusim search` finds. "
                    "With --budget-usd: as many of each GPU as the budget buys, ranked by "
                    "time to train, and why the best one wins.",
        epilog="example: gpusim compare --model llama3-8b --gpus h100-sxm,a100-80gb,"
               "rtx-4090,l40s,mi300x --num-gpus 8 --precision bf16 --tokens 1e10")
    c.add_argument("--model", required=True, help="zoo name or model YAML file")
    c.add_argument("--gpus", required=True,
                   help="comma-separated GPU or CPU profiles, each with its own count if "
                        "you like (rtx-4090:8,h100-sxm:2), or 'all-gpus'")
    c.add_argument("--num-gpus", type=numbers.count, default=1,
                   help="devices of each kind without a count of its own (default 1)")
    c.add_argument("--batch-size", type=numbers.count,
                   help="global batch per step, the same for every device (default: 16 "
                        "sequences or 128 samples per device)")
    flags.add_precision_flag(c)
    flags.add_run_length_flags(c)
    c.add_argument("--seq-len", type=numbers.count, help="sequence length (language models)")
    c.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    c.add_argument("--recompute", "--checkpointing", dest="checkpointing", metavar="MODE",
                   help="fix the recompute mode (default: the fastest that fits, one device)")
    c.add_argument("--loader-workers", type=numbers.count0,
                   help="data-loader workers per device (default 8; 0: synthetic data)")
    c.add_argument("--sort", default="time", choices=SORT_KEYS,
                   help="rank by time to train, cloud cost, cost to own or energy")
    flags.add_price_flag(c)
    own = c.add_argument_group("cost to own")
    own.add_argument("--electricity-usd-per-kwh", type=numbers.nonnegative,
                     default=ELECTRICITY_USD_PER_KWH)
    own.add_argument("--pue", type=numbers.positive, default=PUE,
                     help="facility power over IT power")
    own.add_argument("--lifetime-years", type=numbers.positive, default=LIFETIME_YEARS,
                     help="years the purchase is spread over")
    own.add_argument("--utilization", type=numbers.share, default=1.0,
                     help="share of the lifetime the hardware is busy (default 1)")
    own.add_argument("--host-usd-per-gpu", type=numbers.nonnegative, default=0.0,
                     help="servers, network and racks per device (default 0: devices only)")
    buy = c.add_argument_group("buying advice")
    buy.add_argument("--budget-usd", type=numbers.positive,
                     help="buy as many of each GPU as this budget allows (powers of two)")
    buy.add_argument("--max-gpus", type=numbers.count, default=64,
                     help="the most devices of one kind to consider (default 64)")
    out = c.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--plot", metavar="FILE", type=paths.figure,
                     help="write ranked bars and the time-versus-cost Pareto front")


def _devices(spec: str) -> list[str]:
    if spec == "all-gpus":
        return [g.name for g in catalog().all(GPUProfile)]
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise InvalidConfig("--gpus needs at least one profile name")
    return names


def _options(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("precision", "epochs", "dataset_size", "tokens", "steps", "seq_len", "optimizer",
            "checkpointing", "loader_workers", "usd_per_gpu_hour")
    return {k: getattr(args, k) for k in keys if getattr(args, k) is not None}


def calibration_notes(rows: list[Comparison]) -> list[str]:
    """Which kernel efficiencies are fitted to measurements and which are stated defaults."""
    by_cal: dict[str, list[str]] = {}
    for row in rows:
        if row.result is not None:
            by_cal.setdefault(row.result.calibration, []).append(row.device.name)
    lines = [f"kernel efficiencies {cal}: {', '.join(names)}" for cal, names in by_cal.items()]
    if any("(default)" in cal for cal in by_cal):
        lines.append("default efficiencies are stated per architecture, not fitted to "
                     "measurements of that device (gpusim calibrate fits them)")
    return lines


def run_compare(args: argparse.Namespace) -> int:
    try:
        pricing = Pricing(electricity_usd_per_kwh=args.electricity_usd_per_kwh, pue=args.pue,
                          lifetime_years=args.lifetime_years, utilization=args.utilization,
                          host_usd_per_gpu=args.host_usd_per_gpu)
    except ValidationError as exc:
        err = exc.errors()[0]
        flag = "--" + str(err["loc"][0]).replace("_", "-")
        raise InvalidConfig(f"{flag}: {err['msg'].lower()}") from exc
    devices = _devices(args.gpus)
    options = _options(args)
    why: list[str] = []
    if args.budget_usd is not None:
        if args.max_gpus < 1:
            raise InvalidConfig(f"--max-gpus must be at least 1 (got {args.max_gpus})")
        if any(":" in d for d in devices):
            raise InvalidConfig("with --budget-usd the budget sets each device's count; "
                                "give the devices without counts")
        with ProgressBar("budget", unit="setups") as bar:
            rows, why = budget(args.model, devices, args.budget_usd,
                               max_devices=args.max_gpus, batch_size=args.batch_size,
                               pricing=pricing, progress=bar, **options)
    else:
        with ProgressBar("compare", unit="devices") as bar:
            rows = compare(args.model, devices, num_devices=args.num_gpus,
                           batch_size=args.batch_size, sort=args.sort, pricing=pricing,
                           progress=bar, **options)
    first = next((r.result for r in rows if r.result is not None), None)
    if args.json:
        print(numbers.dumps({"model": first.model if first else args.model,
                          "batch_size": first.batch_size if first else args.batch_size,
                          "budget_usd": args.budget_usd, "sort": args.sort,
                          "pricing": pricing.model_dump(), "why": why,
                          "assumptions": pricing.assumptions(),
                          "rows": [r.to_json() for r in rows]}, indent=2))
    else:
        if first is not None:
            precision = "each device's mixed precision" if args.precision == "auto" \
                else args.precision
            run = f"{first.steps:,} steps of batch {first.batch_size}, {precision}"
            budget_line = (f"; budget ${args.budget_usd:,.0f}, {pricing.host_assumption()}"
                           if args.budget_usd else "")
            print(f"{first.model}: {run}{budget_line}\n")
        show(compare_table(rows))
        if any(r.tight for r in rows):
            print(f"\n{TIGHT_NOTE}")
        if why:
            print("\nwhy:")
            print("\n".join(f"  {line}" for line in why))
        print("\nassumptions:")
        for line in [*pricing.assumptions(), *calibration_notes(rows),
                     "cloud cost: the cheapest listed on-demand price per device-hour (of "
                     "an 8-GPU instance where a setup fills one and one is listed)",
                     "energy: device boards only, from the simulated utilization"]:
            print(f"  - {line}")
    if args.plot:
        from gpusim.plotting.compare import compare_figure

        compare_figure(rows).savefig(args.plot, dpi=120)
        if not args.json:
            print(f"\nplot written to {args.plot}")
    return 0


HANDLERS = {"compare": run_compare}
