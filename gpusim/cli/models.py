"""`gpusim models`: the zoo, and one model's layers, parameters, FLOPs and memory."""

from __future__ import annotations

import argparse
from typing import Any

from gpusim import numbers, units
from gpusim.cli import flags
from gpusim.cli.console import show
from gpusim.cli.estimate import model_from_args
from gpusim.errors import InvalidConfig, InvalidModel
from gpusim.estimation import resolve_model
from gpusim.tables import add_row, new_table
from gpusim.workload import zoo
from gpusim.workload.model import Model
from gpusim.workload.numerics import FP32


def add_parsers(sub: Any) -> None:
    mod = sub.add_parser("models", help="list or show zoo models")
    msub = mod.add_subparsers(dest="action", required=True)
    ml = msub.add_parser("list", help="every zoo model with parameters and FLOPs")
    flags.add_json_flag(ml)
    ms = msub.add_parser("show", help="one model: layers, parameters, FLOPs, memory")
    ms.add_argument("name", help="zoo name, model YAML file, Hugging Face config.json, "
                                 "'transformer' with its dimension flags, or "
                                 "package.module:function (a PyTorch module)")
    flags.add_torch_model_flags(ms)
    flags.add_transformer_flags(ms)
    ms.add_argument("--seq-len", type=numbers.count)
    ms.add_argument("--batch-size", type=numbers.count, default=1,
                    help="batch for the activation-memory figure (default 1)")
    flags.add_json_flag(ms)


def _model_info(model: Model, batch: int) -> dict[str, Any]:
    return {
        "name": model.name,
        "family": model.family,
        "description": model.description,
        "parameters": model.parameters,
        "active_parameters": model.active_parameters,
        "forward_flops_per_sample": model.forward_flops_per_sample,
        "training_flops_per_sample": model.training_flops_per_sample,
        "tokens_per_sample": model.tokens_per_sample,
        "activation_bytes_fp32": model.activation_bytes(batch, FP32),
        "activation_batch_size": batch,
        "layers": len(model.layers),
    }


def _models(args: argparse.Namespace) -> int:
    if args.action == "list":
        rows: list[dict[str, Any]] = []
        unbuilt: list[dict[str, Any]] = []
        for name in zoo.names():
            try:
                rows.append(_model_info(zoo.get(name), 1))
            except InvalidModel as exc:  # a shipped config of a family not modelled yet
                unbuilt.append({"name": name, "not_built": str(exc).split(": ", 1)[-1]})
        if args.json:
            print(numbers.dumps(rows + unbuilt, indent=2))
            return 0
        table = new_table(["name", "parameters", "fwd FLOP/sample", "description"],
                          left=("name", "description"))
        for r in rows:
            add_row(table, [r["name"], units.human_count(r["parameters"]),
                            units.human_count(r["forward_flops_per_sample"]),
                            r["description"]])
        for u in unbuilt:
            add_row(table, [u["name"], "-", "-",
                            f"not built yet: {u['not_built'].split(',')[0]}"])
        show(table)
        return 0
    if args.batch_size <= 0:
        raise InvalidConfig(f"batch size must be positive (got {args.batch_size})")
    model = resolve_model(model_from_args(args.name, args), args.seq_len)
    info = _model_info(model, args.batch_size)
    layers: list[dict[str, Any]] = [
        {"name": lay.name, "type": type(lay).__name__, "parameters": lay.params,
               "forward_flops_per_sample": sum(o.flops for o in lay.forward(1, FP32)),
               "activation_bytes_fp32": lay.saved_bytes(args.batch_size, FP32)}
        for lay in model.layers
    ]
    if args.json:
        print(numbers.dumps({**info, "layer_list": layers}, indent=2))
        return 0
    print(f"{model.name}: {model.description}")
    params = model.parameters
    print(f"  parameters               {params:,} ({units.human_count(params)})")
    if model.active_parameters != params:
        active = model.active_parameters
        print(f"  active a token           {active:,} ({units.human_count(active)})")
    print(f"  forward FLOPs per sample {units.human_count(info['forward_flops_per_sample'])}FLOP")
    print(f"  activations (fp32, batch {args.batch_size}) "
          f"{units.human_bytes(info['activation_bytes_fp32'])}")
    table = new_table(["layer", "type", "params", "fwd FLOP", "activations"],
                      left=("layer", "type"))
    for lay in layers:
        add_row(table, [lay["name"], lay["type"], units.human_count(lay["parameters"]),
                        units.human_count(lay["forward_flops_per_sample"]),
                        units.human_bytes(lay["activation_bytes_fp32"])])
    print()
    show(table)
    return 0


HANDLERS = {"models": _models}
