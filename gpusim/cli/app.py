"""The command line: a thin layer over the Python API.

Domain errors (unknown names, bad files, jobs that do not fit) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from gpusim import (
    cli_compare,
    cli_explore,
    cli_kernel,
    cli_scaling,
    cli_search,
    cli_validation,
    numbers,
    paths,
    units,
)
from gpusim.comm.topology import system_for_gpu
from gpusim.errors import GpusimError, InvalidConfig, InvalidModel, OutOfMemory
from gpusim.estimate import build_job, estimate, resolve_model
from gpusim.hardware.catalog import (
    catalog,
    load_device,
    load_gpu,
    load_profile_file,
    load_system,
)
from gpusim.hardware.profile import (
    CPUProfile,
    DeviceProfile,
    GPUProfile,
    LinkProfile,
    SystemProfile,
)
from gpusim.hardware.template import profile_template
from gpusim.plan.job import (
    DEFAULT_LOADER_WORKERS,
    OPTIMIZERS,
    TRAINING_PRECISIONS,
    TrainingJob,
)
from gpusim.plan.lower import lower
from gpusim.plan.memory_report import memory_report
from gpusim.plan.offload import OFFLOADS
from gpusim.plan.parallel_job import SCHEDULES, ZERO_STAGES
from gpusim.plan.recompute import HELP as RECOMPUTE_HELP
from gpusim.report import TrainingEstimate
from gpusim.sim.ranks import Straggler
from gpusim.stack import ATTENTION_KERNELS
from gpusim.workload import zoo
from gpusim.workload.fp8 import FP8_RECIPES
from gpusim.workload.model import Model
from gpusim.workload.numerics import FP32
from gpusim.workload.zoo.transformer import TransformerConfig, build_transformer

_DIMENSIONS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab")


def _add_job_flags(e: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The flags that describe a training job (model, device, batch, techniques, split),
    shared by estimate and memory; returns the "many GPUs" group for more."""
    e.add_argument("--model", required=True,
                   help="zoo name (gpusim models list), a model YAML file, or 'transformer' "
                        "with --layers/--hidden/--heads")
    e.add_argument("--gpu",
                   help="GPU or CPU profile name or alias (gpusim profiles list), or a YAML "
                        "file; with --system, its GPU")
    e.add_argument("--batch-size", type=numbers.count, required=True,
                   help="samples per optimizer step (the global batch over all GPUs)")
    e.add_argument("--precision", default="fp32", choices=TRAINING_PRECISIONS)
    e.add_argument("--seq-len", type=numbers.count, help="sequence length (language models)")
    tech = e.add_argument_group("training techniques")
    tech.add_argument("--grad-accum", type=numbers.count, default=1,
                      help="microbatches per optimizer step (default 1)")
    tech.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    tech.add_argument("--recompute", "--checkpointing", dest="checkpointing", default="none",
                      metavar="MODE", help=RECOMPUTE_HELP)
    tech.add_argument("--max-batch", action="store_true",
                      help="run the largest microbatch that fits and divides the batch "
                           "(accumulating the rest), as people find it by trial")
    tech.add_argument("--stack", metavar="NAME",
                      help="how the framework writes the layers (norms, grouped K/V, "
                           "SwiGLU): pytorch (default), hf-transformers, litgpt, torchtitan, "
                           "torchtune, megatron, or a stack YAML file (stacks/)")
    tech.add_argument("--fp8-recipe", choices=FP8_RECIPES, default="tensorwise",
                      help="with --precision fp8 (linear layers only; attention, norms and "
                           "the head stay bf16): tensorwise (default; torchao), rowwise, "
                           "delayed (Transformer Engine) or mxfp8 scaling, each with its "
                           "cast and scale kernels")
    tech.add_argument("--attention", choices=ATTENTION_KERNELS,
                      help="attention kernel: auto (SDPA's choice on the GPU; the stack's "
                           "default), flash2 (FlashAttention-2), cudnn, efficient, or math "
                           "(unfused: the seq x seq scores in memory)")
    tech.add_argument("--finetune", default="full", choices=("full", "lora", "qlora"),
                      help="full (default), or LoRA adapters on a frozen base (qlora: the "
                           "base's projections in 4-bit NF4)")
    tech.add_argument("--lora-rank", type=numbers.count, default=8, help="default 8")
    tech.add_argument("--lora-targets", default="q,v",
                      help="projections that get adapters: q,k,v,o,gate,up,down (default q,v)")
    tech.add_argument("--lora-dropout", action="store_true",
                      help="dropout on the adapters' input (keeps a dropped copy and mask)")
    tech.add_argument("--offload", default="none", choices=OFFLOADS,
                      help="keep the optimizer (ZeRO-Offload) or, under --zero 3, FSDP's "
                           "weight shards too (params) in host memory; the CPUs step")
    tech.add_argument("--pure-bf16", action="store_true",
                      help="hold the model in bf16: weights, gradients and optimizer states, "
                           "no fp32 copies (torchtune, LitGPT bf16-true); needs --precision "
                           "bf16")
    tech.add_argument("--freeze", default="",
                      help="comma-separated layer-name prefixes to freeze (e.g. embed,h.0)")
    tech.add_argument("--loader-workers", type=numbers.count0, default=DEFAULT_LOADER_WORKERS,
                      help="data-loader worker processes; 0 for synthetic data on the device")
    many = e.add_argument_group("many GPUs")
    many.add_argument("--num-gpus", type=numbers.count, help="GPUs in the job (default 1)")
    many.add_argument("--nodes", type=numbers.count,
                      help="nodes of --system (instead of --num-gpus)")
    many.add_argument("--system", help="node design (gpusim profiles list), e.g. dgx-h100; "
                                       "default: one built around --gpu")
    many.add_argument("--tp", type=numbers.count, default=1, help="tensor-parallel size")
    many.add_argument("--pp", type=numbers.count, default=1, help="pipeline-parallel stages")
    many.add_argument("--cp", type=numbers.count, default=1,
                      help="context parallelism: split each sequence over this many GPUs "
                           "(attention gathers the others' keys and values; as torchtitan's "
                           "--parallelism.context_parallel_degree)")
    many.add_argument("--ep", type=numbers.count, default=1,
                      help="expert parallelism: each group of this many data-parallel GPUs "
                           "holds a share of every MoE layer's experts and exchanges tokens "
                           "by all-to-all")
    many.add_argument("--dp", type=numbers.count,
                      help="data-parallel size (default: GPUs / (TP x CP x PP))")
    many.add_argument("--microbatch-size", type=numbers.count,
                      help="samples per GPU per forward pass (default: batch / (DP x "
                           "grad-accum))")
    many.add_argument("--schedule", default="1f1b", choices=SCHEDULES,
                      help="pipeline schedule (default 1f1b)")
    many.add_argument("--virtual-stages", type=numbers.count, default=1,
                      help="model chunks per stage for --schedule interleaved")
    many.add_argument("--pp-layers", type=numbers.count_list, metavar="N,N,...",
                      help="blocks on each pipeline stage, first to last (default: the same on "
                           "every stage), e.g. 7,8,8,7 for 30 blocks over --pp 4")
    many.add_argument("--shard-group", type=numbers.count, metavar="N",
                      help="with --zero 3: hybrid sharding (HSDP), FSDP inside groups of N "
                           "data-parallel ranks (a node, say) and replicas across the groups")
    many.add_argument("--zero", type=int, default=0, choices=ZERO_STAGES,
                      help="ZeRO stage: 1 shards optimizer states, 2 also gradients, 3 also "
                           "weights (FSDP full sharding)")
    many.add_argument("--sequence-parallel", action="store_true",
                      help="Megatron-LM sequence parallelism (needs --tp > 1)")
    many.add_argument("--tp-overlap", action="store_true",
                      help="overlap tensor-parallel collectives with the products beside them, "
                           "in chunks (Megatron-LM's --tp-comm-overlap, PyTorch's async TP; "
                           "needs --sequence-parallel)")
    many.add_argument("--no-overlap-grad-reduce", action="store_true",
                      help="reduce data-parallel gradients after the backward pass, not "
                           "during it")
    dims = e.add_argument_group("transformer dimensions (with --model transformer)")
    for name in (*_DIMENSIONS, "head_dim"):
        dims.add_argument(f"--{name.replace('_', '-')}", type=numbers.count)
    dims.add_argument("--mlp", choices=("gelu", "swiglu", "geglu"),
                      help="MLP: gelu (GPT, BERT; default), swiglu (Llama, Mistral, Qwen) or "
                           "geglu (Gemma)")
    dims.add_argument("--norm", choices=("layernorm", "rmsnorm"), help="default layernorm")
    dims.add_argument("--position", choices=("learned", "rope"),
                      help="learned position table (default) or rotary embeddings")
    dims.add_argument("--tie-embeddings", action=argparse.BooleanOptionalAction,
                      help="share the token table with the output head (default: tied)")
    dims.add_argument("--bias", action=argparse.BooleanOptionalAction,
                      help="biases on the projections (default: with)")
    return many


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (the usage of estimate alone runs to forty
    lines, which buried the one that says what is wrong)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gpusim",
        description="Predict deep-learning training time and cost on GPUs and CPUs.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("estimate", help="predict step time, time to train, cost and memory",
                       description="Predict one training run on one GPU or CPU.")
    many = _add_job_flags(e)
    cli_explore.add_run_length_flags(e)
    e.add_argument("--usd-per-gpu-hour", type=numbers.nonnegative, metavar="USD",
                   help="price the run at this rate per GPU-hour (default: the profile's "
                        "cheapest listed on-demand price, named in the output)")
    many.add_argument("--per-rank", action="store_true",
                      help="simulate every data-parallel replica, not one per stage")
    many.add_argument("--straggler", metavar="RANK:FACTOR",
                      help="one slow GPU: its kernels take FACTOR times as long (implies "
                           "--per-rank), e.g. 17:1.25")
    many.add_argument("--slow-link", metavar="RANK:FACTOR",
                      help="one slow link: every transfer and collective of that rank takes "
                           "FACTOR times as long (implies --per-rank)")
    many.add_argument("--comm-slowdown", type=numbers.fraction, default=0.0, metavar="FRACTION",
                      help="kernels run this fraction slower while a data-parallel collective "
                           "runs beside them, e.g. 0.1 (default 0: no interference)")
    out = e.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object")
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
    _add_job_flags(mem)
    mem.add_argument("--json", action="store_true", help="print one JSON object")

    prof = sub.add_parser("profiles", help="list, show or check hardware profiles")
    psub = prof.add_subparsers(dest="action", required=True)
    pl = psub.add_parser("list", help="every GPU, CPU, link and system profile")
    pl.add_argument("--json", action="store_true")
    ps = psub.add_parser("show", help="one profile, every field and its source")
    ps.add_argument("name")
    ps.add_argument("--json", action="store_true")
    pc = psub.add_parser("check", help="validate a profile YAML file")
    pc.add_argument("file")
    pc.add_argument("--json", action="store_true")
    pn = psub.add_parser("new", help="start a profile of your own from a shipped one",
                         description="Write a profile YAML to edit: every field of an "
                                     "existing profile (units are in the field names), its "
                                     "own name, no prices, and each source marked for you "
                                     "to fill in. `gpusim profiles check FILE` then "
                                     "validates it.")
    pn.add_argument("file", type=paths.output_file(".yaml", ".yml"))
    pn.add_argument("--from", dest="base", required=True,
                    help="the profile to copy, e.g. h100-sxm")

    mod = sub.add_parser("models", help="list or show zoo models")
    msub = mod.add_subparsers(dest="action", required=True)
    ml = msub.add_parser("list", help="every zoo model with parameters and FLOPs")
    ml.add_argument("--json", action="store_true")
    ms = msub.add_parser("show", help="one model: layers, parameters, FLOPs, memory")
    ms.add_argument("name", help="zoo name or model YAML file")
    ms.add_argument("--seq-len", type=numbers.count)
    ms.add_argument("--batch-size", type=numbers.count, default=1,
                    help="batch for the activation-memory figure (default 1)")
    ms.add_argument("--json", action="store_true")
    cli_validation.add_parsers(sub)
    cli_explore.add_parsers(sub)
    cli_search.add_parsers(sub)
    cli_compare.add_parsers(sub)
    cli_scaling.add_parsers(sub)
    cli_kernel.add_parsers(sub)
    return p


# Architecture flags of --model transformer and the TransformerConfig fields they set.
_ARCHITECTURE = {"head_dim": "head_dim", "mlp": "activation", "norm": "norm",
                 "position": "positions", "tie_embeddings": "tied_embeddings", "bias": "bias"}


def _model_from_args(args: argparse.Namespace) -> str | Model:
    given = {name: getattr(args, name) for name in _DIMENSIONS if getattr(args, name) is not None}
    for flag, field in _ARCHITECTURE.items():
        value = getattr(args, flag, None)
        if value is not None:
            given[field] = "rotary" if value == "rope" else value
    if args.model != "transformer":
        if given:
            names = {v: k for k, v in _ARCHITECTURE.items()}
            flags = ", ".join(f"--{names.get(k, k).replace('_', '-')}" for k in given)
            raise InvalidConfig(f"{flags} apply only to --model transformer")
        return str(args.model)
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
        "tp": args.tp, "pp": args.pp, "dp": args.dp, "cp": args.cp, "ep": args.ep,
        "microbatch_size": args.microbatch_size,
        "schedule": args.schedule, "virtual_stages": args.virtual_stages, "zero": args.zero,
        "pp_layers": args.pp_layers or (), "shard_group": args.shard_group or 0,
        "sequence_parallel": args.sequence_parallel, "tp_overlap": args.tp_overlap,
        "overlap_grad_reduce": not args.no_overlap_grad_reduce, "max_batch": args.max_batch,
        "pure_bf16": args.pure_bf16, "stack": args.stack, "attention": args.attention,
        "fp8_recipe": args.fp8_recipe,
        "offload": args.offload,
        "finetune": args.finetune, "lora_rank": args.lora_rank,
        "lora_targets": args.lora_targets, "lora_dropout": args.lora_dropout,
    }


def _estimate(args: argparse.Namespace) -> int:
    if args.dataset_size is not None and args.epochs is None:
        raise InvalidConfig("--dataset-size needs --epochs")
    options = _job_options(args)
    model, frozen = options["model"], options["frozen"]
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
    _figures(args, result, model, frozen)
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


def _figures(args: argparse.Namespace, result: TrainingEstimate, model: str | Model,
             frozen: tuple[str, ...]) -> None:
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
        job = TrainingJob(resolve_model(model, args.seq_len), load_device(args.gpu),
                          args.batch_size, args.precision, args.grad_accum, args.optimizer,
                          args.checkpointing, frozen, args.loader_workers)
        title = (f"{result.model} on {result.device_name}, batch {result.batch_size}, "
                 f"{result.precision}")
        roofline_figure(lower(job), job.device, numerics=job.numerics(),
                        title=title).savefig(args.roofline, dpi=120)


def _profile_row(p: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"name": p.name, "kind": p.kind, "full_name": p.full_name}
    if isinstance(p, DeviceProfile):
        peak = max([*p.matrix_tflops.values(), *p.vector_tflops.values()])
        row.update(memory_gib=p.memory_gib, memory_bandwidth_gb_s=p.memory_bandwidth_gb_s,
                   peak_tflops=peak, tdp_w=p.tdp_w)
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
        if args.json:
            print(numbers.dumps({"ok": True, **profile.model_dump(mode="json")}, indent=2))
        else:
            print(f"{args.file}: ok ({profile.kind} {profile.name!r})")
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
    print(f"{'name':18s} {'kind':7s} {'memory':>10s} {'bandwidth':>12s} {'peak':>12s}  full name")
    for r in rows:
        mem = f"{r['memory_gib']:g} GiB" if "memory_gib" in r else ""
        bw = f"{r['memory_bandwidth_gb_s']:g} GB/s" if "memory_bandwidth_gb_s" in r else ""
        peak = f"{r['peak_tflops']:g} TF/s" if "peak_tflops" in r else ""
        print(f"{r['name']:18s} {r['kind']:7s} {mem:>10s} {bw:>12s} {peak:>12s}  {r['full_name']}")
    return 0


def _model_info(model: Model, batch: int) -> dict[str, Any]:
    return {
        "name": model.name,
        "family": model.family,
        "description": model.description,
        "parameters": model.parameters,
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
        width = max(len(r["name"]) for r in rows)
        print(f"{'name':{width}s} {'parameters':>12s} {'fwd FLOPs/sample':>18s}  description")
        for r in rows:
            print(f"{r['name']:{width}s} {units.human_count(r['parameters']):>12s} "
                  f"{units.human_count(r['forward_flops_per_sample']):>18s}  {r['description']}")
        for u in unbuilt:
            print(f"{u['name']:{width}s} {'-':>12s} {'-':>18s}  not built yet: "
                  f"{u['not_built'].split(',')[0]}")
        return 0
    if args.batch_size <= 0:
        raise InvalidConfig(f"batch size must be positive (got {args.batch_size})")
    model = resolve_model(args.name, args.seq_len)
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
    print(f"  forward FLOPs per sample {units.human_count(info['forward_flops_per_sample'])}FLOP")
    print(f"  activations (fp32, batch {args.batch_size}) "
          f"{units.human_bytes(info['activation_bytes_fp32'])}")
    print(f"\n  {'layer':32s} {'type':12s} {'params':>10s} {'fwd FLOPs':>10s} {'activations':>12s}")
    for lay in layers:
        print(f"  {lay['name']:32s} {lay['type']:12s} {units.human_count(lay['parameters']):>10s}"
              f" {units.human_count(lay['forward_flops_per_sample']):>10s}"
              f" {units.human_bytes(lay['activation_bytes_fp32']):>12s}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handlers = {"estimate": _estimate, "memory": _memory, "profiles": _profiles,
                "models": _models,
                **cli_validation.HANDLERS, **cli_explore.HANDLERS, **cli_search.HANDLERS,
                **cli_compare.HANDLERS, **cli_scaling.HANDLERS, **cli_kernel.HANDLERS}
    try:
        return handlers[args.command](args)
    except BrokenPipeError:
        # The reader stopped early (| head): nothing more to say, and nothing to flush at
        # exit either (the recipe in Python's signal documentation).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OutOfMemory as exc:
        print(f"gpusim: error: {exc.message(cli=True)}", file=sys.stderr)
        return 2
    except GpusimError as exc:
        print(f"gpusim: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
