"""`gpusim search`: rank the parallel configurations of a model on N GPUs."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpusim import numbers, units
from gpusim.errors import InvalidConfig
from gpusim.estimate import resolve_model, resolve_topology
from gpusim.explore.search import search
from gpusim.plan.job import DEFAULT_LOADER_WORKERS, OPTIMIZERS, TRAINING_PRECISIONS


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
    s.add_argument("--precision", default="bf16", choices=TRAINING_PRECISIONS)
    s.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    s.add_argument("--top", type=numbers.count, default=10,
                   help="rows to show and simulate (default 10)")
    s.add_argument("--loader-workers", type=numbers.count0, default=DEFAULT_LOADER_WORKERS,
                   help=f"data-loader workers per data-parallel replica (default "
                        f"{DEFAULT_LOADER_WORKERS}; 0: synthetic data on the device)")
    s.add_argument("--json", action="store_true", help="print one JSON object")


class _Progress:
    def __init__(self) -> None:
        self.live = sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        if self.live and (done % 25 == 0 or done == total):
            filled = round(30 * done / total) if total else 30
            sys.stderr.write(f"\rsearch [{'#' * filled}{'.' * (30 - filled)}] {done}/{total}")
            if done == total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def run_search(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise InvalidConfig(f"--top must be at least 1 (got {args.top})")
    model = resolve_model(args.model, args.seq_len)
    topology, assumed = resolve_topology(args.gpu, args.system, args.num_gpus)
    result = search(model, topology, args.batch_size, precision=args.precision,
                    optimizer=args.optimizer, top=args.top, loader_workers=args.loader_workers,
                    progress=_Progress())
    quote = topology.gpu.cloud_price_usd_per_hour()
    price = quote.usd_per_hour if quote else None
    rows = [r.to_json(batch=args.batch_size, tokens=model.tokens_per_sample,
                      usd_per_gpu_hour=price, num_gpus=topology.num_gpus)
            for r in result.ranked[:args.top]]
    if args.json:
        print(numbers.dumps({"model": model.name, "system": topology.system.name,
                          "num_gpus": topology.num_gpus, "considered": result.considered,
                          "fit": len(result.ranked), "rejected": len(result.rejected),
                          "dominated": result.dominated,
                          "elapsed_s": result.elapsed_s, "price_usd_per_gpu_hour": price,
                          "ranked": rows,
                          "rejected_examples": [{"config": c, "why": w}
                                                for c, w in result.rejected[:20]]}, indent=2))
        return 0
    where = f"{topology.num_gpus} x {topology.gpu.full_name} on {topology.system.full_name}"
    print(f"{model.name}, global batch {args.batch_size}, {args.precision}: {where}"
          + (" (assumed node design)" if assumed else ""))
    print(f"{result.considered} configurations, {len(result.ranked)} fit, "
          f"{len(result.rejected)} set aside, {result.dominated} skipped (a lighter "
          f"recompute of the same split fits), in {result.elapsed_s:.1f} s\n")
    print(f"{'#':>3} {'TP':>3} {'CP':>3} {'EP':>3} {'PP':>3} {'DP':>5} {'mb':>3} {'schedule':>14} "
          f"{'ZeRO':>4} "
          f"{'SP':>3} {'recompute':>9} {'step':>10} {'MFU':>6} {'mem/GPU':>10} {'$/step':>8}")
    for i, r in enumerate(rows, 1):
        sched = r["schedule"] + (f" v{r['virtual_stages']}" if r["virtual_stages"] > 1 else "")
        usd = r["cost_per_step_usd"]
        cost = "n/a" if usd is None else f"{usd:.2f}" if usd >= 0.01 else f"{usd:.2g}"
        mark = "" if r["simulated"] else "*"
        print(f"{i:>3} {r['tp']:>3} {r['cp']:>3} {r['ep']:>3} {r['pp']:>3} {r['dp']:>5} "
              f"{r['microbatch_size']:>3} "
              f"{sched:>14} {r['zero']:>4} {'yes' if r['sequence_parallel'] else 'no':>3} "
              f"{r['recompute']:>9} {units.human_seconds(r['step_time_s']) + mark:>10} "
              f"{100 * r['mfu']:5.1f}% {units.human_bytes(r['peak_memory_per_gpu_bytes']):>10} "
              f"{cost:>8}")
    if any(not r["simulated"] for r in rows):
        print("\n* closed-form estimate, not simulated")
    if result.rejected:
        config, why = result.rejected[0]
        print(f"\nset aside, for example: {config}: {why}")
    return 0


HANDLERS = {"search": run_search}
