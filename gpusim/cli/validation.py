"""Commands that tie predictions to real runs: measure, calibrate and validate."""

from __future__ import annotations

import argparse
import math
from typing import Any

from gpusim import numbers, paths
from gpusim.calibrate import fit
from gpusim.cli.console import show
from gpusim.errors import InvalidConfig, MissingDependency
from gpusim.hardware.calibration import load_calibration_file
from gpusim.tables import add_row, new_table
from gpusim.validate.compare import cross_device_ranking, run_spread, validate_all
from gpusim.validate.report import format_reports


def add_parsers(sub: Any) -> None:
    m = sub.add_parser(
        "measure", help="time real PyTorch runs of a suite on this machine (needs torch)",
        description="Measure the micro suite (for calibration) or the models suite (for "
                    "validation) on this machine's GPU, or on its CPU when it has none, and "
                    "write <out>/<suite>.json with provenance.")
    m.add_argument("--suite", required=True, choices=("micro", "models"))
    m.add_argument("--out", required=True,
                   help="folder for the JSON file, by convention measurements/<device>")
    m.add_argument("--device",
                   help="profile to record under (default: the GPU's own name; required on a "
                        "CPU)")
    m.add_argument("--repeats", type=numbers.count, default=30,
                   help="timed samples per case (default 30; the slowest cases use 10)")
    m.add_argument("--quick", action="store_true",
                   help="a few cases of each kind only (a smoke test, not for calibration)")
    m.add_argument("--no-layers", action="store_true",
                   help="models suite: time whole steps only, not each layer")
    m.add_argument("--max-minutes", type=numbers.positive, default=None,
                   help="stop starting cases after this long and write what was measured "
                        "(the rest are recorded as skipped); default: no limit")
    m.add_argument("--kinds", type=lambda text: [k for k in text.split(",") if k],
                   help="micro suite: only these kinds of case, comma-separated (e.g. "
                        "dispatch,autograd,layer_host,host_step,optimizer)")

    c = sub.add_parser(
        "calibrate", help="fit a device's efficiencies to its measured micro suite",
        description="Fit the calibration of the device measured in a micro-suite file (and "
                    "from nothing else) and write it where predictions will use it.")
    c.add_argument("--from", dest="source", required=True, action="append",
                   help="micro-suite file, e.g. measurements/<device>/micro.json; give it "
                        "again for repeated runs of one device (pooled; host figures their "
                        "median)")
    c.add_argument("--bound-by", dest="bound_by", action="append", default=[],
                   help="a published micro file of the same device whose searched maxima "
                        "(GEMM rows marked fit: false) bound the fit: no GEMM shape is "
                        "predicted faster than the fastest a search found")
    c.add_argument("--out", help="calibration file to write (default: "
                                 "hardware_profiles/calibration/<device>.yaml)")
    c.add_argument("--dry-run", action="store_true", help="show the fit; write nothing")
    c.add_argument("--for-architecture", action="store_true",
                   help="write the fit as the calibration of the measured device's whole "
                        "architecture (hardware_profiles/calibration/<architecture>.yaml), "
                        "used by every GPU of it without a fit of its own")

    v = sub.add_parser(
        "validate", help="compare predictions with every committed measurement",
        description="Predict every committed models-suite case and compare with what was "
                    "measured: per case, per layer, peak memory, and rankings.")
    v.add_argument("--device", help="only this device's measurements")
    v.add_argument("--calibration",
                   help="a calibration file to predict with instead of each device's own "
                        "(e.g. one fitted on another GPU: the cross-GPU test)")
    v.add_argument("--measurements", help="folder of <device>/models.json files "
                                          "(default: the repository's measurements/)")
    v.add_argument("--runs", action="store_true",
                   help="also each repeat run (models-run<N>.json, measured on other leases "
                        "of the machine), and how far the runs lie apart")
    v.add_argument("--layers", action="store_true", help="print every layer's row too")
    v.add_argument("--json", action="store_true", help="machine-readable report")
    v.add_argument("--plot", type=paths.figure,
                   help="write predicted-against-measured to this PNG/SVG/PDF")


def measure(args: argparse.Namespace) -> int:
    try:
        from gpusim.measure import runner
    except ImportError as exc:
        raise MissingDependency(
            f"measuring needs PyTorch ({exc.name} is missing): pip install torch"
        ) from exc
    path = runner.run(args.suite, args.out, args.device, args.repeats, args.quick,
                      layers=not args.no_layers, max_minutes=args.max_minutes,
                      kinds=args.kinds)
    print(f"wrote {path}")
    return 0


def calibrate(args: argparse.Namespace) -> int:
    result = fit.fit(args.source, bound_by=args.bound_by)
    if args.for_architecture:
        result = fit.for_architecture(result)
    cal = result.calibration
    print(f"calibration of {cal.device or cal.architecture} from {result.source}")
    table = new_table(["group", "cases", "error before", "after", "worst case after"],
                      left=("group", "worst case after"))
    for g in result.groups:
        add_row(table, [g.group, g.cases, f"{g.error_before:.1%}", f"{g.error_after:.1%}",
                        f"{g.worst_case} ({g.worst_error:+.0%})"])
        for name, value in g.parameters.items():
            add_row(table, [f"    {name}", "", "", "", f"{value:.4g}"])
    show(table)
    o = cal.overhead
    print(f"  overhead: dispatch {o.dispatch_us:.3g} us, launch {o.launch_us:.3g} us, "
          f"kernel gap {o.kernel_us:.3g} us, autograd {o.autograd_us:.3g} us per op, module "
          f"call {o.module_us:.3g} us, backward() call {o.backward_call_us:.3g} us")
    if not args.dry_run:
        out = fit.write(result, args.out or fit.default_output(str(cal.device or
                                                                   cal.architecture)))
        print(f"wrote {out.name} ({len(result.groups)} groups fitted)")
    return 0


def _clean(value: Any) -> Any:
    """NaN (no data) as null, so the JSON is valid."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def validate(args: argparse.Namespace) -> int:
    if args.device is not None and not args.device.strip():
        raise InvalidConfig("--device needs a profile name (leave it out for every device)")
    cal = load_calibration_file(args.calibration) if args.calibration else None
    reports = validate_all(args.measurements, args.device, cal, runs=args.runs)
    if args.plot:
        from gpusim.plotting.validation import validation_figure

        validation_figure(reports, args.plot)
    if args.json:
        out = {"devices": [r.to_dict() for r in reports],
               "across_devices": cross_device_ranking(reports),
               "between_runs": run_spread(reports)}
        print(numbers.dumps(_clean(out), indent=1))
        return 0
    print(format_reports(reports, verbose=args.layers))
    if args.plot:
        print(f"wrote {args.plot}")
    return 0


HANDLERS = {"measure": measure, "calibrate": calibrate, "validate": validate}
