"""`gpusim scaling`: throughput and scaling efficiency of one job over several GPU counts."""

from __future__ import annotations

import argparse
from typing import Any

from gpusim import numbers, paths
from gpusim.cli import flags
from gpusim.cli.console import show
from gpusim.errors import InvalidConfig
from gpusim.explore.scaling import scaling
from gpusim.hardware.catalog import load_device, load_gpu, load_system
from gpusim.plan.job import AUTO_PRECISION, OPTIMIZERS, auto_precision
from gpusim.plan.parallel_job import SCHEDULES, ZERO_STAGES
from gpusim.plan.recompute import HELP as RECOMPUTE_HELP
from gpusim.tables import scaling_table


def add_parsers(sub: Any) -> None:
    s = sub.add_parser(
        "scaling", help="throughput and scaling efficiency over GPU counts",
        description="Estimate one training step at each GPU count: weak scaling with "
                    "--batch-size-per-gpu (the global batch grows with the GPUs), strong "
                    "scaling with --batch-size (fixed). Efficiency is throughput per GPU over "
                    "that of the smallest count that runs; counts that do not run (out of "
                    "memory, a split that does not divide) are listed with the reason. Each "
                    "data-parallel replica has --loader-workers data-loader workers (0: "
                    "synthetic input), sharing the node's CPU cores.",
        epilog="example: gpusim scaling --model gpt3-1.3b --gpu h100-sxm --num-gpus "
               "1,2,4,8,16 --batch-size-per-gpu 4 --precision bf16 --seq-len 2048 "
               "--plot scaling.png")
    s.add_argument("--model", required=True, help="zoo name or model YAML file")
    s.add_argument("--gpu", help="GPU profile name or alias, or a YAML file")
    s.add_argument("--system", help="node design, e.g. dgx-h100 (default: built around --gpu)")
    s.add_argument("--num-gpus", required=True, metavar="N,N,...",
                   help="comma-separated GPU counts, e.g. 1,2,4,8,16")
    batch = s.add_mutually_exclusive_group(required=True)
    batch.add_argument("--batch-size-per-gpu", type=numbers.count,
                       help="samples per GPU per step: weak scaling")
    batch.add_argument("--batch-size", type=numbers.count,
                       help="global samples per step at every count: strong scaling")
    s.add_argument("--seq-len", type=numbers.count, help="sequence length (language models)")
    flags.add_precision_flag(s)
    s.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    s.add_argument("--recompute", "--checkpointing", dest="checkpointing", default="none",
                   metavar="MODE", help=RECOMPUTE_HELP)
    s.add_argument("--tp", type=numbers.count, default=1, help="tensor-parallel size")
    s.add_argument("--pp", type=numbers.count, default=1, help="pipeline-parallel stages")
    s.add_argument("--microbatch-size", type=numbers.count,
                   help="samples per GPU per forward pass (default: batch / DP)")
    s.add_argument("--schedule", default="1f1b", choices=SCHEDULES)
    s.add_argument("--zero", type=int, default=0, choices=ZERO_STAGES, help="ZeRO stage")
    s.add_argument("--sequence-parallel", action="store_true")
    flags.add_loader_flag(s)
    flags.add_json_flag(s)
    s.add_argument("--plot", metavar="FILE", type=paths.figure,
                   help="write a PNG of throughput and efficiency")


def _counts(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InvalidConfig(f"--num-gpus takes comma-separated GPU counts such as 1,2,4,8 "
                            f"(got {text!r})") from None


def run_scaling(args: argparse.Namespace) -> int:
    if args.gpu is None and args.system is None:
        raise InvalidConfig("give --gpu or --system")
    weak = args.batch_size_per_gpu is not None
    rows = scaling(args.model, args.gpu, _counts(args.num_gpus),
                   batch_size_per_gpu=args.batch_size_per_gpu, batch_size=args.batch_size,
                   seq_len=args.seq_len, precision=args.precision, optimizer=args.optimizer,
                   checkpointing=args.checkpointing, system=args.system, tp=args.tp,
                   pp=args.pp, microbatch_size=args.microbatch_size, schedule=args.schedule,
                   zero=args.zero, sequence_parallel=args.sequence_parallel,
                   loader_workers=args.loader_workers)
    batch = (f"weak scaling, {args.batch_size_per_gpu} samples per GPU" if weak
             else f"strong scaling, global batch {args.batch_size}")
    split = f", TP {args.tp} x PP {args.pp}" if args.tp * args.pp > 1 else ""
    precision = args.precision
    if precision == AUTO_PRECISION:
        device = load_device(args.gpu) if args.gpu else load_gpu(load_system(args.system).gpu)
        precision = f"{auto_precision(device)} (auto)"
    title = f"{args.model} on {args.gpu or args.system}, {precision}{split}: {batch}"
    if args.json:
        print(numbers.dumps({"model": args.model, "gpu": args.gpu, "system": args.system,
                          "scaling": "weak" if weak else "strong",
                          "rows": [r.to_json() for r in rows]}, indent=2))
    else:
        print(title + "\n")
        show(scaling_table(rows))
        for r in rows:
            if not r.fits:
                print(f"\ndoes not run on {r.num_gpus} GPU{'s' if r.num_gpus > 1 else ''}: "
                      f"{r.error}")
    if args.plot:
        from gpusim.plotting.scaling import scaling_figure

        scaling_figure(rows, title).savefig(args.plot, dpi=120)
        if not args.json:
            print(f"\nplot written to {args.plot}")
    return 0


HANDLERS = {"scaling": run_scaling}
