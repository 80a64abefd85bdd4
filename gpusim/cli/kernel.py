"""`gpusim kernel`: one kernel predicted, beside the project's measurement of the same case."""

from __future__ import annotations

import argparse
from typing import Any

from gpusim import numbers, units
from gpusim.errors import InvalidConfig
from gpusim.hardware.catalog import load_device
from gpusim.validate.kernel import (
    KERNELS_BY_NAME,
    attention_case,
    gemm_case,
    memory_case,
    predict_kernel,
)

GEMM_PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")
MEMORY_OPS = ("copy", "add", "sum", "cast")


def add_parsers(sub: Any) -> None:
    k = sub.add_parser(
        "kernel", help="predict one kernel (a matrix product, attention, a copy)",
        description="Predict one kernel as the micro suite times it: its time, the TFLOP/s or "
                    "GB/s it reaches, what bounds it and its efficiency; where the project "
                    "measured the same case on the device, the measurement and the error.",
        epilog="examples: gpusim kernel --gpu h100-sxm --op gemm --m 8192 --n 8192 --k 8192 "
               "--precision bf16; gpusim kernel --gpu h100-sxm --op attention --batch 8 "
               "--heads 32 --kv-heads 8 --seq 2048 --head-dim 128 --causal --kernel flash2")
    k.add_argument("--gpu", required=True, help="GPU or CPU profile name, or a YAML file")
    k.add_argument("--op", required=True, choices=("gemm", "attention", *MEMORY_OPS))
    g = k.add_argument_group("gemm")
    for dim in ("m", "n", "k"):
        g.add_argument(f"--{dim}", type=numbers.count)
    g.add_argument("--precision", choices=GEMM_PRECISIONS, default="bf16")
    a = k.add_argument_group("attention (bf16 SDPA)")
    for name in ("batch", "heads", "kv-heads", "seq", "head-dim"):
        a.add_argument(f"--{name}", type=numbers.count)
    a.add_argument("--causal", action="store_true")
    a.add_argument("--kernel", choices=("auto", *KERNELS_BY_NAME), default="auto",
                   help="auto: SDPA's choice on the device")
    a.add_argument("--pass", dest="phase", choices=("forward", "backward"), default="forward")
    k.add_argument("--bytes", type=numbers.count, help="copy, add, sum, cast: fp32 bytes read")
    k.add_argument("--json", action="store_true", help="machine-readable result")


def _need(args: argparse.Namespace, *names: str) -> None:
    missing = [n for n in names if getattr(args, n.replace("-", "_")) is None]
    if missing:
        raise InvalidConfig(f"--op {args.op} needs {', '.join('--' + m for m in missing)}")


def run_kernel(args: argparse.Namespace) -> int:
    device = load_device(args.gpu)
    if args.op == "gemm":
        _need(args, "m", "n", "k")
        case = gemm_case(args.m, args.n, args.k, args.precision)
    elif args.op == "attention":
        _need(args, "batch", "heads", "seq", "head-dim")
        case = attention_case(args.batch, args.heads, args.kv_heads or args.heads, args.seq,
                              args.head_dim, args.causal, args.kernel, args.phase)
    else:
        _need(args, "bytes")
        case = memory_case(args.op, args.bytes)
    result = predict_kernel(case, device)
    if args.json:
        print(numbers.dumps(result.to_dict(), indent=2))
        return 0
    print(f"{result.case_id} on {device.name} (calibration {result.calibration})")
    print(f"  predicted        {units.human_seconds(result.seconds):>12}"
          f"  (device alone {units.human_seconds(result.kernel_seconds)})")
    if result.bound == "compute":
        print(f"  achieved         {result.achieved_tflop_s:>10.1f} TFLOP/s")
    print(f"  moved            {result.achieved_gb_s:>10.1f} GB/s")
    peak = "the unit's peak FLOP/s" if result.bound == "compute" else "the memory bandwidth"
    print(f"  bound            {result.bound:>12}  at {result.efficiency:.1%} of {peak}")
    if result.measured_s is not None and result.error is not None:
        print(f"  measured         {units.human_seconds(result.measured_s):>12}  "
              f"({result.measured_in}); the prediction is {result.error:+.1%} off it")
    else:
        print("  measured         none for this case on this device")
    return 0


HANDLERS = {"kernel": run_kernel}
