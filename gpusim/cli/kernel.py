"""`gpusim kernel`: one kernel predicted, beside the project's measurement of the same case."""

from __future__ import annotations

import argparse
from typing import Any

from gpusim import numbers, units
from gpusim.calibrate.micro_ops import ROW_KERNEL_LAYERS
from gpusim.comm.collectives import Collective, bus_bandwidth, fastest_algorithm
from gpusim.errors import InvalidConfig
from gpusim.estimation import resolve_topology
from gpusim.hardware.catalog import load_device
from gpusim.validate.kernel import (
    KERNELS_BY_NAME,
    attention_case,
    gemm_case,
    memory_case,
    predict_kernel,
    row_case,
)

GEMM_PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")
MEMORY_OPS = ("copy", "add", "sum", "cast")
ROW_OPS = tuple(ROW_KERNEL_LAYERS)
# --op name -> the collective, as nccl-tests names its tests
COLLECTIVE_OPS: dict[str, Collective] = {"allreduce": "all_reduce", "allgather": "all_gather",
                  "reducescatter": "reduce_scatter", "alltoall": "all_to_all",
                  "broadcast": "broadcast"}


def add_parsers(sub: Any) -> None:
    k = sub.add_parser(
        "kernel", help="predict one kernel (a matrix product, attention, a norm, a copy, a "
                       "collective)",
        description="Predict one kernel as the micro suite times it: its time, the TFLOP/s or "
                    "GB/s it reaches, what bounds it and its efficiency; where the project "
                    "measured the same case on the device, the measurement and the error.",
        epilog="examples: gpusim kernel --gpu h100-sxm --op gemm --m 8192 --n 8192 --k 8192 "
               "--precision bf16; gpusim kernel --gpu h100-sxm --op attention --batch 8 "
               "--heads 32 --kv-heads 8 --seq 2048 --head-dim 128 --causal --kernel flash2; "
               "gpusim kernel --gpu h100-sxm --op rms_norm --rows 16384 --cols 4096 --upcast; "
               "gpusim kernel --system dgx-h100 --op allreduce --gpus 8 --bytes 1073741824")
    k.add_argument("--gpu", help="GPU or CPU profile name, or a YAML file")
    k.add_argument("--op", required=True,
                   choices=("gemm", "attention", *ROW_OPS, *MEMORY_OPS, *COLLECTIVE_OPS))
    g = k.add_argument_group("gemm")
    for dim in ("m", "n", "k"):
        g.add_argument(f"--{dim}", type=numbers.count)
    g.add_argument("--precision", choices=GEMM_PRECISIONS, default="bf16",
                   help="gemm: the product's type; attention: SDPA's inputs (bf16, fp16, "
                        "fp32)")
    a = k.add_argument_group("attention (SDPA, in --precision)")
    for name in ("batch", "heads", "kv-heads", "seq", "head-dim"):
        a.add_argument(f"--{name}", type=numbers.count)
    a.add_argument("--causal", action="store_true")
    a.add_argument("--kernel", choices=("auto", *KERNELS_BY_NAME), default="auto",
                   help="auto: SDPA's choice on the device")
    a.add_argument("--pass", dest="phase", choices=("forward", "backward"), default="forward",
                   help="attention and row kernels: forward or backward")
    r = k.add_argument_group("row kernels (bf16: rms_norm, layer_norm, gelu, silu_mul)")
    r.add_argument("--rows", type=numbers.count, help="rows (tokens)")
    r.add_argument("--cols", type=numbers.count, help="columns (the hidden size)")
    r.add_argument("--upcast", action="store_true",
                   help="rms_norm written as separate fp32 ops (torchtitan's of 2024, Hugging "
                        "Face's)")
    r.add_argument("--compiled", action="store_true", help="under torch.compile")
    c = k.add_argument_group("collectives (allreduce, allgather, reducescatter, alltoall, "
                             "broadcast)")
    c.add_argument("--gpus", type=numbers.count, help="ranks taking part")
    c.add_argument("--system", help="system profile (default: one built around --gpu)")
    k.add_argument("--bytes", type=numbers.count,
                   help="copy, add, sum, cast: fp32 bytes read; a collective: each rank's "
                        "buffer, as nccl-tests sizes it")
    k.add_argument("--json", action="store_true", help="machine-readable result")


def _need(args: argparse.Namespace, *names: str) -> None:
    missing = [n for n in names if getattr(args, n.replace("-", "_")) is None]
    if missing:
        raise InvalidConfig(f"--op {args.op} needs {', '.join('--' + m for m in missing)}")


def _collective(args: argparse.Namespace) -> int:
    _need(args, "gpus", "bytes")
    if args.gpus < 2:
        raise InvalidConfig("--gpus must be at least 2 for a collective")
    topo, assumed = resolve_topology(args.gpu, args.system, args.gpus)
    name = COLLECTIVE_OPS[args.op]
    group = topo.place(args.gpus)
    algorithm, seconds = fastest_algorithm(name, group, float(args.bytes))
    alg_bw = args.bytes / seconds if seconds else 0.0
    bus_bw = bus_bandwidth(name, args.gpus, float(args.bytes), seconds)
    where = f"{topo.system.name} x{args.gpus}" + (" (assumed)" if assumed else "")
    if args.json:
        print(numbers.dumps({"collective": name, "system": topo.system.name,
                             "ranks": args.gpus, "bytes": args.bytes, "algorithm": algorithm,
                             "predicted_s": seconds, "alg_bw_gb_s": alg_bw / 1e9,
                             "bus_bw_gb_s": bus_bw / 1e9}, indent=2))
        return 0
    print(f"{name} of {units.human_bytes(args.bytes)} over {where}")
    print(f"  predicted        {units.human_seconds(seconds):>12}  ({algorithm})")
    print(f"  algorithm bw     {alg_bw / 1e9:>10.1f} GB/s")
    print(f"  bus bw           {bus_bw / 1e9:>10.1f} GB/s  (nccl-tests' busBw)")
    print("  measured         python benchmarks/collectives.py compares published nccl-tests "
          "runs")
    return 0


def run_kernel(args: argparse.Namespace) -> int:
    if args.op in COLLECTIVE_OPS:
        return _collective(args)
    if args.gpu is None:
        raise InvalidConfig(f"--op {args.op} needs --gpu")
    device = load_device(args.gpu)
    if args.op == "gemm":
        _need(args, "m", "n", "k")
        case = gemm_case(args.m, args.n, args.k, args.precision)
    elif args.op == "attention":
        _need(args, "batch", "heads", "seq", "head-dim")
        case = attention_case(args.batch, args.heads, args.kv_heads or args.heads, args.seq,
                              args.head_dim, args.causal, args.kernel, args.phase,
                              args.precision)
    elif args.op in ROW_OPS:
        _need(args, "rows", "cols")
        case = row_case(args.op, args.rows, args.cols, args.phase, args.upcast, args.compiled)
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
    if result.exposed_write_s:
        print(f"  result write     {units.human_seconds(result.exposed_write_s):>12}  of it "
              f"not hidden by the main loop (a product writes its result after its last K "
              f"step)")
    if result.measured_s is not None and result.error is not None:
        against = " (the kernels alone, against the device's own time)" \
            if result.measured_kernel_only else ""
        print(f"  measured         {units.human_seconds(result.measured_s):>12}  "
              f"({result.measured_in}); the prediction is {result.error:+.1%} off it"
              f"{against}")
    else:
        print("  measured         none for this case on this device")
    return 0


HANDLERS = {"kernel": run_kernel}
