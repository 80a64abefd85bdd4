"""`gpusim profiles`: list, show, check and start hardware profiles."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpusim import numbers, paths
from gpusim.cli import flags
from gpusim.cli.console import show
from gpusim.errors import InvalidConfig
from gpusim.hardware.catalog import catalog, load_profile_file
from gpusim.hardware.plausibility import plausibility_warnings
from gpusim.hardware.profile import (
    CPUProfile,
    DeviceProfile,
    GPUProfile,
    LinkProfile,
    SystemProfile,
)
from gpusim.hardware.template import profile_template
from gpusim.tables import add_row, new_table


def add_parsers(sub: Any) -> None:
    prof = sub.add_parser("profiles", help="list, show or check hardware profiles")
    psub = prof.add_subparsers(dest="action", required=True)
    pl = psub.add_parser("list", help="every GPU, CPU, link and system profile")
    flags.add_json_flag(pl)
    ps = psub.add_parser("show", help="one profile, every field and its source")
    ps.add_argument("name")
    flags.add_json_flag(ps)
    pc = psub.add_parser("check", help="validate a profile YAML file")
    pc.add_argument("file")
    flags.add_json_flag(pc)
    pn = psub.add_parser("new", help="start a profile of your own from a shipped one",
                         description="Write a profile YAML to edit: every field of an "
                                     "existing profile (units are in the field names), its "
                                     "own name, no prices, and each source marked for you "
                                     "to fill in. `gpusim profiles check FILE` then "
                                     "validates it.")
    pn.add_argument("file", type=paths.output_file(".yaml", ".yml"))
    pn.add_argument("--from", dest="base", required=True,
                    help="the profile to copy, e.g. h100-sxm")


def _dense_peak(p: DeviceProfile) -> tuple[str, float]:
    """The training peak people compare: dense bf16 (else fp16, else fp32), matrix units
    where the device has them; not int8, which training does not use."""
    for precision in ("bf16", "fp16", "fp32"):
        rates = [r for r in (p.matrix_tflops.get(precision), p.vector_tflops.get(precision))
                 if r is not None]
        if rates:
            return precision, max(rates)
    return "fp32", 0.0


def _profile_row(p: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"name": p.name, "kind": p.kind, "full_name": p.full_name}
    if isinstance(p, DeviceProfile):
        precision, peak = _dense_peak(p)
        row.update(memory_gib=p.memory_gib, memory_bandwidth_gb_s=p.memory_bandwidth_gb_s,
                   peak_tflops=peak, peak_precision=precision, tdp_w=p.tdp_w)
        if "int8" in p.matrix_tflops:
            row["int8_tops"] = p.matrix_tflops["int8"]
    return row


def _new_profile(base: Any, path: Path) -> int:
    if path.exists():
        raise InvalidConfig(f"{path} exists; give a new file name")
    path.write_text(profile_template(base, path))
    print(f"wrote {path} (from {base.name}); edit it, then: gpusim profiles check {path}")
    return 0


def _profiles(args: argparse.Namespace) -> int:
    if args.action == "check":
        if Path(args.file).parent.name == "calibration":
            from gpusim.hardware.calibration import load_calibration_file

            cal = load_calibration_file(args.file)
            print(f"{args.file}: ok (calibration {cal.name!r}, {cal.status})")
            return 0
        profile = load_profile_file(args.file)
        warnings = plausibility_warnings(profile)
        if args.json:
            print(numbers.dumps({"ok": True, "warnings": warnings,
                                 **profile.model_dump(mode="json")}, indent=2))
        else:
            print(f"{args.file}: ok ({profile.kind} {profile.name!r})"
                  + (f", {len(warnings)} warning{'s' if len(warnings) > 1 else ''}"
                     if warnings else ""))
            for warning in warnings:
                print(f"{args.file}: warning: {warning}", file=sys.stderr)
        return 0
    cat = catalog()
    if args.action == "new":
        return _new_profile(cat.find(args.base), Path(args.file))
    if args.action == "show":
        found = cat.find(args.name)
        data = found.model_dump(mode="json")
        if args.json:
            print(numbers.dumps(data, indent=2))
        else:
            sources = data.pop("sources", {})
            for key, value in data.items():
                print(f"{key:24s} {value}")
            print("\nsources:")
            for key, value in sources.items():
                print(f"  {key:22s} {value}")
        return 0
    every: list[Any] = [*cat.all(GPUProfile), *cat.all(CPUProfile), *cat.all(LinkProfile),
                        *cat.all(SystemProfile)]
    rows = [_profile_row(p) for p in every]
    if args.json:
        print(numbers.dumps(rows, indent=2))
        return 0
    table = new_table(["name", "kind", "memory", "bandwidth", "dense peak", "int8",
                       "full name"], left=("name", "kind", "dense peak", "full name"))
    for r in rows:
        add_row(table, [
            r["name"], r["kind"], f"{r['memory_gib']:g} GiB" if "memory_gib" in r else "",
            f"{r['memory_bandwidth_gb_s']:g} GB/s" if "memory_bandwidth_gb_s" in r else "",
            f"{r['peak_tflops']:g} TFLOP/s {r['peak_precision']}" if "peak_tflops" in r
            else "", f"{r['int8_tops']:g} TOPS" if "int8_tops" in r else "", r["full_name"]])
    show(table)
    return 0


HANDLERS = {"profiles": _profiles}
