"""`gpusim search`: rank the parallel configurations of a model on N GPUs."""

from __future__ import annotations

import argparse
from typing import Any

from gpusim import numbers
from gpusim.cli import flags
from gpusim.cli.console import show
from gpusim.errors import InvalidConfig
from gpusim.estimation import resolve_model, resolve_topology
from gpusim.explore.search import search
from gpusim.plan.job import OPTIMIZERS
from gpusim.progress import ProgressBar
from gpusim.tables import TIGHT_NOTE, search_table


def add_parsers(sub: Any) -> None:
    s = sub.add_parser(
        "search", help="rank TP/CP/EP/PP/DP/microbatch/ZeRO/recompute/schedule splits for N "
                       "GPUs",
        description="Try every valid parallel configuration, set aside those that do not fit "
                    "(saying why), rank the rest by predicted step time; the best --top are "
                    "simulated in full, the others ranked by the closed-form pipeline time.",
        epilog="example: gpusim search --model gpt3-175b --system dgx-a100 --num-gpus 1024 "
               "--batch-size 1536 --precision bf16")
    s.add_argument("--model", required=True, help="zoo name or model YAML file")
    s.add_argument("--system", help="node design, e.g. dgx-h100 (default: built around --gpu)")
    s.add_argument("--gpu", help="GPU profile when no --system is given")
    s.add_argument("--num-gpus", type=numbers.count, required=True)
    s.add_argument("--batch-size", type=numbers.count, required=True, help="global batch per step")
    s.add_argument("--seq-len", type=numbers.count)
    flags.add_precision_flag(s)
    s.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    s.add_argument("--top", type=numbers.count, default=10,
                   help="rows to show and simulate (default 10)")
    flags.add_loader_flag(s)
    flags.add_price_flag(s)
    flags.add_json_flag(s)


def run_search(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise InvalidConfig(f"--top must be at least 1 (got {args.top})")
    model = resolve_model(args.model, args.seq_len)
    topology, assumed = resolve_topology(args.gpu, args.system, args.num_gpus)
    with ProgressBar("search", unit="configurations") as bar:
        result = search(model, topology, args.batch_size, precision=args.precision,
                        optimizer=args.optimizer, top=args.top,
                        loader_workers=args.loader_workers, progress=bar)
    quote = topology.gpu.cloud_price_usd_per_hour(topology.num_gpus)
    price = args.usd_per_gpu_hour if args.usd_per_gpu_hour is not None else \
        quote.usd_per_hour if quote else None
    rows = [r.to_json(batch=args.batch_size, tokens=model.tokens_per_sample,
                      usd_per_gpu_hour=price, num_gpus=topology.num_gpus)
            for r in result.ranked[:args.top]]
    if args.json:
        print(numbers.dumps({"model": model.name, "system": topology.system.name,
                          "num_gpus": topology.num_gpus, "precision": result.precision,
                          "considered": result.considered,
                          "fit": len(result.ranked), "rejected": len(result.rejected),
                          "dominated": result.dominated,
                          "elapsed_s": result.elapsed_s, "price_usd_per_gpu_hour": price,
                          "ranked": rows,
                          "rejected_examples": [{"config": c, "why": w}
                                                for c, w in result.rejected[:20]]}, indent=2))
        return 0
    where = f"{topology.num_gpus} x {topology.gpu.full_name} on {topology.system.full_name}"
    precision = result.precision + (" (auto)" if args.precision == "auto" else "")
    print(f"{model.name}, global batch {args.batch_size}, {precision}: {where}"
          + (" (assumed node design)" if assumed else ""))
    print(f"{result.considered} configurations, {len(result.ranked)} fit, "
          f"{len(result.rejected)} set aside, {result.dominated} skipped (a lighter "
          f"recompute of the same split fits), in {result.elapsed_s:.1f} s\n")
    show(search_table(rows))
    if any(not r["simulated"] for r in rows):
        print("\n* closed-form estimate, not simulated")
    if any(r["memory_tight"] for r in rows):
        print(f"\n{TIGHT_NOTE}")
    if result.rejected:
        config, why = result.rejected[0]
        print(f"\nset aside, for example: {config}: {why}")
    return 0


HANDLERS = {"search": run_search}
