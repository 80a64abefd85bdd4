"""`gpusim estimate` (one run: step time, time to train, cost, memory) and `gpusim memory`
(does it fit, and by what parts)."""

from __future__ import annotations

import argparse
from typing import Any

from gpusim import numbers, paths
from gpusim.cli import flags
from gpusim.comm.topology import system_for_gpu
from gpusim.errors import InvalidConfig
from gpusim.estimation import build_job, estimate
from gpusim.hardware.catalog import load_device, load_gpu, load_system
from gpusim.plan.job import TrainingJob
from gpusim.plan.lower import lower
from gpusim.plan.memory_report import memory_report
from gpusim.report import TrainingEstimate
from gpusim.sim.ranks import Straggler
from gpusim.workload.from_torch import load_torch_model
from gpusim.workload.model import Model
from gpusim.workload.zoo.transformer import TransformerConfig, build_transformer


def add_parsers(sub: Any) -> None:
    e = sub.add_parser("estimate", help="predict step time, time to train, cost and memory",
                       description="Predict one training run on one GPU or CPU.")
    many = flags.add_job_flags(e)
    flags.add_run_length_flags(e)
    flags.add_price_flag(e)
    many.add_argument("--per-rank", action="store_true",
                      help="simulate every data-parallel replica, not one per stage")
    many.add_argument("--straggler", metavar="RANK:FACTOR",
                      help="one slow GPU: its kernels take FACTOR times as long (implies "
                           "--per-rank), e.g. 17:1.25")
    many.add_argument("--slow-link", metavar="RANK:FACTOR",
                      help="one slow link: every transfer and collective of that rank takes "
                           "FACTOR times as long (implies --per-rank)")
    many.add_argument("--comm-slowdown", type=numbers.fraction, default=None,
                      metavar="FRACTION",
                      help="kernels run this fraction slower while a data-parallel collective "
                           "runs beside them (default 0.189, the average measured over GPT "
                           "and Llama training on A100s, H100s, MI250s and MI210s, arXiv "
                           "2507.03114; 0: no interference)")
    out = e.add_argument_group("output")
    flags.add_json_flag(out)
    out.add_argument("--trace", metavar="FILE", type=paths.trace,
                     help="write a Chrome/Perfetto trace (JSON)")
    out.add_argument("--plot", metavar="FILE", type=paths.figure,
                     help="write a PNG of the timeline and breakdown")
    out.add_argument("--memory-plot", metavar="FILE", type=paths.figure,
                     help="write a PNG of the memory breakdown against the usable memory")
    out.add_argument("--roofline", metavar="FILE", type=paths.figure,
                     help="write a PNG of the device's roofline with the step's kernels on it "
                          "(single-device jobs)")

    mem = sub.add_parser("memory", help="per-GPU peak memory by part, and the largest "
                                        "microbatch that fits",
                         description="Does it fit? The per-GPU peak (allocated and reserved) "
                                     "and its parts, activations by layer kind, where the "
                                     "peak falls, and the largest microbatch that fits. "
                                     "Nothing is simulated.")
    flags.add_job_flags(mem)
    flags.add_json_flag(mem)


# Architecture flags of --model transformer and the TransformerConfig fields they set.
_ARCHITECTURE = {"head_dim": "head_dim", "mlp": "activation", "norm": "norm",
                 "position": "positions", "tie_embeddings": "tied_embeddings", "bias": "bias",
                 "experts": "experts", "top_k": "top_k", "expert_ffn_hidden": "moe_ffn",
                 "shared_ffn_hidden": "shared_ffn", "dense_layers": "dense_layers",
                 "moe_every": "moe_every"}


def torch_model(spec: str, args: argparse.Namespace) -> Model | None:
    """The PyTorch module ``spec`` names (package.module:function), or None when it names
    a zoo model or a file."""
    if ":" not in spec or paths.names_a_file(spec) or spec.endswith((".yaml", ".yml", ".json")):
        if getattr(args, "input_shape", None):
            raise InvalidConfig("--input-shape goes with --model package.module:function")
        return None
    return load_torch_model(spec, args.input_shape, integer_input=args.input_ids)


def _model_from_args(args: argparse.Namespace) -> str | Model:
    return model_from_args(str(args.model), args)


def model_from_args(spec: str, args: argparse.Namespace) -> str | Model:
    """The model ``spec`` names, built when it is a PyTorch module or ``transformer`` with
    its dimension flags; a zoo name or file as it is."""
    imported = torch_model(spec, args)
    if imported is not None:
        return imported
    given = {name: getattr(args, name) for name in flags.DIMENSIONS
             if getattr(args, name) is not None}
    for flag, field in _ARCHITECTURE.items():
        value = getattr(args, flag, None)
        if value is not None:
            given[field] = "rotary" if value == "rope" else value
    if spec != "transformer":
        if given:
            names = {v: k for k, v in _ARCHITECTURE.items()}
            named = ", ".join(f"--{names.get(k, k).replace('_', '-')}" for k in given)
            raise InvalidConfig(f"{named} apply only to --model transformer")
        return spec
    missing = [f"--{k}" for k in ("layers", "hidden", "heads") if k not in given]
    if missing:
        raise InvalidConfig(f"--model transformer needs {', '.join(missing)}")
    try:
        cfg = TransformerConfig(seq_len=args.seq_len or 2048, **given)
    except ValueError as exc:
        raise InvalidConfig(f"transformer dimensions: {exc}".split("\n")[0]) from exc
    return build_transformer(cfg)


def _straggler(args: argparse.Namespace) -> Straggler | None:
    gpu = Straggler.parse(args.straggler, "compute") if args.straggler else None
    link = Straggler.parse(args.slow_link, "link") if args.slow_link else None
    return gpu.merge(link) if gpu else link


def _job_options(args: argparse.Namespace) -> dict[str, Any]:
    """build_job's and estimate's arguments from the job flags (see _add_job_flags)."""
    model = _model_from_args(args)
    frozen = tuple(p for p in args.freeze.split(",") if p)
    if args.gpu is None and args.system is None:
        raise InvalidConfig("give --gpu (one device, or with --num-gpus) or --system")
    num_gpus = args.num_gpus or 1
    if args.nodes is not None:
        if args.num_gpus is not None:
            raise InvalidConfig("give --nodes or --num-gpus, not both")
        if args.nodes < 1:
            raise InvalidConfig(f"--nodes must be at least 1 (got {args.nodes})")
        per_node = (load_system(args.system).gpus_per_node if args.system
                    else system_for_gpu(load_gpu(args.gpu))[0].gpus_per_node)
        num_gpus = args.nodes * per_node
    return {
        "model": model, "gpu": args.gpu, "batch_size": args.batch_size,
        "precision": args.precision, "seq_len": args.seq_len, "grad_accum": args.grad_accum,
        "optimizer": args.optimizer, "checkpointing": args.checkpointing, "frozen": frozen,
        "loader_workers": args.loader_workers, "num_gpus": num_gpus, "system": args.system,
        "tp": args.tp, "pp": args.pp, "dp": args.dp, "cp": args.cp, "ep": args.ep, "etp": args.etp,
        "microbatch_size": args.microbatch_size,
        "schedule": args.schedule, "virtual_stages": args.virtual_stages, "zero": args.zero,
        "pp_layers": args.pp_layers or (), "pp_layout": args.pp_layout,
        "shard_group": args.shard_group or 0,
        "sequence_parallel": args.sequence_parallel, "tp_overlap": args.tp_overlap,
        "ep_overlap": args.ep_overlap, "ep_dispatcher": args.ep_dispatcher,
        "moe_imbalance": args.moe_imbalance, "moe_capacity": args.capacity_factor or 0.0,
        "moe_pad": args.pad_to_capacity,
        "overlap_grad_reduce": not args.no_overlap_grad_reduce,
        "bf16_grads": args.grad_reduce_in_bf16, "bf16_states": args.bf16_optimizer_states,
        "max_batch": args.max_batch,
        "pure_bf16": args.pure_bf16, "stack": args.stack, "attention": args.attention,
        "fp8_recipe": args.fp8_recipe,
        "offload": args.offload, "optimizer_in_backward": args.optimizer_in_backward,
        "offload_activations": args.offload_activations,
        "finetune": args.finetune, "lora_rank": args.lora_rank,
        "lora_targets": args.lora_targets, "lora_dropout": args.lora_dropout,
        "channels_last": args.channels_last, "power_limit_w": args.power_limit,
        "compile": args.compile,
    }


def _estimate(args: argparse.Namespace) -> int:
    if args.dataset_size is not None and args.epochs is None:
        raise InvalidConfig("--dataset-size needs --epochs")
    options = _job_options(args)
    result = estimate(
        **options, epochs=args.epochs, dataset_size=args.dataset_size, tokens=args.tokens,
        steps=args.steps, per_rank=args.per_rank, straggler=_straggler(args),
        comm_slowdown=args.comm_slowdown, usd_per_gpu_hour=args.usd_per_gpu_hour,
    )
    if args.roofline and result.step.parallel is not None:
        raise InvalidConfig("--roofline draws the kernels of a single-device job; leave out "
                            "--num-gpus, --system and the parallel flags (--plot draws every "
                            "pipeline stage)")
    if args.trace:
        result.step.trace.write_chrome(args.trace)
    _figures(args, result, options)
    if args.json:
        print(numbers.dumps(result.to_json(), indent=2))
    else:
        print(result.summary())
        for label, path in (("trace", args.trace), ("plot", args.plot),
                            ("memory plot", args.memory_plot), ("roofline", args.roofline)):
            if path:
                print(f"\n{label} written to {path}")
    return 0


def _memory(args: argparse.Namespace) -> int:
    job, _ = build_job(**_job_options(args))
    report = memory_report(job)
    print(numbers.dumps(report.to_json(), indent=2) if args.json else report.summary())
    return 0


def _figures(args: argparse.Namespace, result: TrainingEstimate,
             options: dict[str, Any]) -> None:
    """Write the PNGs that --plot, --memory-plot and --roofline ask for."""
    if args.plot:
        from gpusim.plotting.timeline import step_figure

        step_figure(result).savefig(args.plot, dpi=120)
    if args.memory_plot:
        from gpusim.plotting.memory import memory_figure

        devices = [load_device(args.gpu)] if args.gpu else None  # --gpu may be a YAML file
        memory_figure(result, devices).savefig(args.memory_plot, dpi=120)
    if args.roofline:
        from gpusim.plotting.roofline import roofline_figure

        # The job estimate() simulated, rebuilt to lower it to its kernels.
        job, _ = build_job(**options)
        assert isinstance(job, TrainingJob)  # a parallel job was refused above
        title = (f"{result.model} on {result.device_name}, batch {result.batch_size}, "
                 f"{result.precision}")
        roofline_figure(lower(job), job.device, numerics=job.numerics(),
                        title=title).savefig(args.roofline, dpi=120)


HANDLERS = {"estimate": _estimate, "memory": _memory}
