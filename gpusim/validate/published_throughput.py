"""Published, measured training throughputs of LLMs (published/throughput.yaml), predicted.

Each case is written as the run was configured: its model's dimensions, GPUs, batch,
sequence, FSDP/TP/PP split, recompute mode, precision and FP8 recipe, and the framework's
stack. What gpusim does not model is said per case and the case is either skipped (context
parallelism) or predicted as the nearest thing it models and flagged
(torch.compile runs are predicted compiled). Validation only: nothing here is fitted.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpusim.data import data_dir
from gpusim.errors import GpusimError
from gpusim.estimation import estimate
from gpusim.hardware.catalog import load_gpu
from gpusim.hardware.profile import DeviceProfile
from gpusim.plan.parallel_job import uneven_split
from gpusim.stack import Stack, load_stack
from gpusim.validate.torchtitan import MID_2025_COMMITS, torchtitan_pipeline
from gpusim.workload import zoo
from gpusim.workload.hf_config import transformer_from_hf
from gpusim.workload.model import Model
from gpusim.workload.moe import MoE
from gpusim.workload.zoo.transformer import TransformerConfig, build_transformer

CASES_FILE = data_dir("published") / "throughput.yaml"
# More cases, collected later: mixtures of experts (Megatron-Bridge, Megatron-MoE-ModelZoo,
# NeMo AutoModel on H100) and dense runs on AMD MI300X and MI325X.
MORE_CASES_FILE = data_dir("published") / "throughput_more.yaml"
RECOMPUTE = {"selective-op": "per-op", "full": "full", "none": "none"}


# The bar the parallelism issue sets for a published run: predicted within 15%.
WITHIN = 0.15


@dataclass(frozen=True)
class ThroughputRow:
    id: str
    measured: float  # tokens/s per GPU
    predicted: float | None
    flags: tuple[str, ...]  # what the prediction leaves out (torch.compile, ...)
    skipped: str = ""
    architecture: str = ""  # the GPU's, for the report by architecture
    stack: str = ""  # the software stack the case ran on, for the report by stack
    layout: str = ""  # mixture of experts or dense, with or without PP or CP (layout_of)

    @property
    def error(self) -> float | None:
        return None if self.predicted is None else self.predicted / self.measured - 1


def load_cases(*paths: Path) -> list[dict[str, Any]]:
    """The cases of ``paths`` (default: both shipped files), in order."""
    cases: list[dict[str, Any]] = []
    for path in paths or (CASES_FILE, MORE_CASES_FILE):
        data = yaml.safe_load(path.read_text())
        cases += data["cases"] if isinstance(data, dict) else data
    return cases


def _gpu(text: str) -> DeviceProfile:
    low = text.lower()
    if "mi325x" in low:
        return load_gpu("mi325x")
    if "mi300x" in low:
        return load_gpu("mi300x")
    if "h200" in low:
        return load_gpu("h200")
    if "b200" in low:
        return load_gpu("b200")
    if "a100" in low:
        return load_gpu("a100-80gb")
    if "96gb" in low:  # Meta's Grand Teton H100s: 96 GB of HBM2e, a 500 W limit
        return load_gpu("h100-sxm-96gb")
    return load_gpu("h100-sxm")


def _window(m: dict[str, Any]) -> int:
    """The sliding window a case states (its ``window``, else its attention text), or 0."""
    if isinstance(m.get("window"), int):
        return int(m["window"])
    found = re.search(r"window_size (\d+)", str(m.get("attention", "")))
    return int(found.group(1)) if found else 0


def _shipped(m: dict[str, Any]) -> str:
    """The shipped model config a case's model is (for dimensions the case gives as text,
    as multi-head latent attention's), or ''."""
    return "deepseek-v3" if str(m.get("name", "")).startswith("DeepSeek-V3") else ""


def model_of(m: dict[str, Any], seq: int) -> Model:
    """The transformer a published case's model block describes (its dimensions; a gated MLP
    means SwiGLU with RoPE and no biases, else GELU with learned positions and biases, unless
    the block says ``positions`` and ``bias``; any other plain activation, as Nemotron's
    squared ReLU, is costed as GELU's one elementwise pass; ``dropout`` where it trains with
    some; ``qk_layernorm`` where queries and keys are normalized per head, as Qwen3's)."""
    if _shipped(m):
        mtp = int(m.get("mtp_layers") or 0)
        if not mtp:
            return zoo.get(_shipped(m), seq_len=seq)
        # the shipped config with its multi-token prediction, as the run trained it
        path = zoo.shipped_configs()[_shipped(m)]
        data = yaml.safe_load(path.read_text())
        cfg = transformer_from_hf(data["hf_config"], str(path), _shipped(m), seq)
        return build_transformer(cfg.model_copy(update={"mtp_layers": mtp}))
    gated = bool(m.get("gated_mlp"))
    norm = "rmsnorm" if "rms" in str(m.get("norm", "")) else "layernorm"
    experts = int(m.get("experts") or 0)
    ffn = m.get("ffn_hidden")
    positions = str(m.get("positions") or ("rotary" if gated else "learned"))
    cfg = TransformerConfig(
        name=str(m["name"]), layers=m["layers"], hidden=m["hidden"], heads=m["heads"],
        kv_heads=m.get("kv_heads"), head_dim=m.get("head_dim"),
        ffn_hidden=ffn if isinstance(ffn, int) else None, vocab=m["vocab"],
        seq_len=seq, norm=norm, activation="swiglu" if gated else "gelu",
        positions=positions, max_positions=seq if positions == "learned" else None,
        tied_embeddings=bool(m.get("tied_embeddings")), bias=bool(m.get("bias", not gated)),
        experts=experts,
        top_k=int(m.get("top_k") or 2), moe_ffn=m.get("expert_ffn_hidden"),
        shared_ffn=int(m.get("shared_expert_ffn_hidden") or 0), sliding_window=_window(m),
        dropout=bool(m.get("dropout")),
        global_every=int(m.get("global_every") or 0), qk_norm=bool(m.get("qk_layernorm")))
    return build_transformer(cfg)


def _not_modelled(case: dict[str, Any]) -> str:
    """What the case runs that gpusim cannot express, or ''."""
    m, t = case["model"], case["training"]
    if not isinstance(m.get("kv_heads", 0), int) and not _shipped(m):
        return "multi-head latent attention (MLA) without its dimensions"
    if "sliding" in str(m.get("attention", "")).lower() and not _window(m):
        return "sliding-window attention without its window size"
    if not str(t.get("precision", "")).startswith(("bf16", "fp8", "mxfp8")):
        return "precision not stated"
    if not isinstance(t.get("seq_len"), int):
        return "sequence length not stated"
    return ""


def _stack(case: dict[str, Any]) -> str:
    source = str(case["source"]["url_or_repo_path"])
    framework = str(case["framework"])
    if "torchtitan" in source or any(c in framework for c in MID_2025_COMMITS):
        # the commit the page ran at: 2025's (June: async TP, H200; August: torchao's
        # tables) or December 2024's
        return "torchtitan-2025" if any(c in framework for c in MID_2025_COMMITS) \
            else "torchtitan-2024"
    if ("Megatron" in source or source.startswith("NVIDIA/NeMo ")
            or framework.startswith("Megatron")):
        return "megatron"  # NeMo's LLM training runs Megatron-Core with Transformer Engine
    if "llm-foundry" in source:
        return "llm-foundry-2023"
    if "Automodel" in source:
        return "nemo-automodel"
    if "torchtitan" in framework:
        # AMD's ROCm/torchtitan fork of early 2025 ('minor changes'): torchtitan's choices of
        # its December 2024 benchmarks, the fork's own changes not public
        return "torchtitan-2024"
    if "pytorch-training-benchmark" in source:
        # train_fsdp.py: its own modules in bf16, Transformer Engine layers for fp8
        te = str(case["training"]["precision"]).startswith("fp8")
        return "amd-ptb-2025-te" if te else "amd-ptb-2025"
    return "pytorch"


def job_of(case: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...], str]:
    """(estimate keywords, what the prediction leaves out, why it cannot run or '')."""
    t, p = case["training"], case["training"]["parallelism"]
    why = _not_modelled(case)
    if why:
        return {}, (), why
    gpus = int(case["hardware"]["num_gpus"])
    seq = int(t["seq_len"])
    tp, pp = int(p.get("tp") or 1), int(p.get("pp") or 1)
    cp, ep = int(p.get("cp") or 1), int(p.get("ep") or 1)
    vp = int(p.get("vp") or 1)
    dp = gpus // (tp * pp * cp)
    flags = list(case.get("assumed", []))  # what the case itself says it leaves unknown
    micro = t["local_batch_size"]
    if not isinstance(micro, int):
        micro = 1
        flags.append("microbatch 1 assumed")
    stated = t.get("global_batch_size")
    accum = t.get("grad_accum")
    batch = stated if isinstance(stated, int) else \
        micro * dp * (accum if isinstance(accum, int) else 1)
    precision = "fp8" if str(t["precision"]).startswith(("fp8", "mxfp8")) else "bf16"
    # True, or the doc's own word for it ("true (doc: ...)")
    compiled = t.get("torch_compile") is True or str(t.get("torch_compile")).startswith("true")
    if not isinstance(stated, int):
        flags.append("global batch not stated: one microbatch per step assumed")
    other = str(t.get("other", "")).lower()
    # PyTorch's async TP, or Megatron's TP communication overlap (TE userbuffers)
    async_tp = "async tp on" in other or "tp communication overlap" in other
    name = _stack(case)
    stack: str | Stack = name
    if name == "amd-ptb-2025":
        # train_fsdp.py compiles the model unless told not to (enable_compile=True), and the
        # published bf16 commands do not say so; its Mistral repeats K and V per head
        # (mistral.py: k.repeat_interleave before FlashSelfAttention)
        compiled = True
        flags.append("compiled, the benchmark script's default")
        if "mistral" in str(case["model"]["name"]).lower():
            stack = load_stack(name).model_copy(update={"kv_heads": "expanded"})
    kwargs: dict[str, Any] = {
        # a run that trains multi-token prediction says so beside the model it trains
        "model": model_of({**case["model"], "mtp_layers": t.get("mtp_layers", 0)}, seq),
        "gpu": _gpu(case["hardware"]["gpu"]),
        "batch_size": batch, "precision": precision, "seq_len": seq, "num_gpus": gpus,
        "tp": tp, "pp": pp, "cp": cp, "ep": ep, "microbatch_size": micro,
        "optimizer": "adamw", "checkpointing": _recompute(t, flags, str(case.get("framework", "")),
                                    str(case["model"]["name"])),
        "stack": stack, "fp8_recipe": _fp8_recipe(str(t["precision"])), "compile": compiled,
        "zero": 3 if int(p.get("dp_shard", 1)) > 1 else 1,
    }
    if int(p.get("dp_shard", 1)) > 1 and int(p.get("dp_replicate", 1)) > 1:
        kwargs["shard_group"] = int(p["dp_shard"])  # hybrid sharding (HSDP)
    if str(t.get("grad_reduce", "")).startswith("bf16"):  # as the case's source says
        kwargs["bf16_grads"] = True
    if str(t.get("optimizer_states", "")).startswith("bf16"):
        kwargs["bf16_states"] = True
    if p.get("etp"):  # Megatron's expert tensor parallel size, where the source states it
        kwargs["etp"] = int(p["etp"])
    if ep > 1 and ("a2a_overlap true" in other or "a2a_overlap" in case["id"]):
        kwargs["ep_overlap"] = True  # Megatron's --overlap-moe-expert-parallel-comm
    named = " ".join((case["id"], other, str(case.get("framework")))).lower()
    if ep > 1 and ("deepep" in named or "hybridep" in named):
        # the run names DeepEP, or NVIDIA's HybridEP (DeepEP's hybrid-ep branch, Megatron's
        # flex dispatcher backend 'hybridep')
        kwargs["ep_dispatcher"] = "hybridep" if "hybridep" in named else "deepep"
    if tp > 1:  # torchtitan's TP plan and Megatron both split norms and dropout by sequence
        kwargs["sequence_parallel"] = True
        kwargs["tp_overlap"] = async_tp
    if pp > 1 and kwargs["zero"] == 3:
        kwargs["zero"] = 1
        flags.append("FSDP with PP predicted as ZeRO-1")
    if pp > 1 and name == "torchtitan-2024":
        # torchtitan's defaults: as many microbatches as stages, its own stage split
        schedule_text = "Interleaved 1F1B" if "interleaved" in case["id"] else "1F1B"
        _, micro, schedule, virtual, split = torchtitan_pipeline(
            {"pp_schedule": schedule_text}, pp, micro, int(case["model"]["layers"]))
        kwargs.update(microbatch_size=micro, schedule=schedule, virtual_stages=virtual,
                      pp_layers=split)
    elif pp > 1 and name != "megatron":
        # The microbatch count is not published: one sequence each, the local batch over PP.
        kwargs["microbatch_size"] = 1
        flags.append("microbatch 1 assumed")
        blocks = int(case["model"]["layers"])
        chunks = pp * (vp if vp > 1 else 2 if "interleaved" in case["id"] else 1)
        if blocks % chunks:
            kwargs["pp_layers"] = tuple(int(b) for b in uneven_split(blocks, chunks).split(","))
            flags.append("stage split assumed")
    if name == "megatron" and int(p.get("dp_shard", 1)) <= 1:
        kwargs.update(zero=1)  # the distributed optimizer; Megatron-FSDP (dp_shard) is ZeRO-3
        if vp > 1:
            kwargs.update(schedule="interleaved", virtual_stages=vp)
        blocks, chunks = int(case["model"]["layers"]), pp * vp
        if p.get("pp_layout"):  # the run's own split: Megatron's pipeline layout string
            kwargs["pp_layout"] = str(p["pp_layout"])
        elif pp > 1 and blocks % chunks and (blocks + 2) % chunks == 0:
            # Megatron-LM's account_for_embedding/loss_in_pipeline_split: the embedding and
            # the loss count as a layer each when layers are dealt to the model chunks
            per = (blocks + 2) // chunks
            kwargs["pp_layers"] = (per - 1, *[per] * (chunks - 2), per - 1)
            flags.append("embedding and loss counted as a layer each in the pipeline split")
    if "overlap_grad_reduce false" in other:
        kwargs["overlap_grad_reduce"] = False
    if pp > 1 and name not in ("megatron", "torchtitan-2024"):
        if vp > 1:
            kwargs.update(schedule="interleaved", virtual_stages=vp)
        elif "interleaved" in case["id"]:
            kwargs.update(schedule="interleaved", virtual_stages=2)
            flags.append("interleaved stages assumed 2 per GPU")
    return kwargs, tuple(flags), ""


def _fp8_recipe(precision: str) -> str:
    """The scaling a case's fp8 runs: Transformer Engine's DelayedScaling where the case
    says so (its only recipe before TE 2), torchao's rowwise or MX scaling, or block scaling
    (DeepSeek-V3's 1x128/128x128), where it names them, else per-tensor current scaling."""
    low = precision.lower()
    for recipe in ("delayed", "rowwise", "mxfp8", "blockwise"):
        if recipe in low:
            return recipe
    return "tensorwise"


def _recompute(t: dict[str, Any], flags: list[str], framework: str = "", model: str = "") -> str:
    """The recompute mode a case states; free text as its nearest mode, flagged."""
    text = str(t.get("activation_checkpointing", "none"))
    if text in RECOMPUTE:
        return RECOMPUTE[text]
    if re.fullmatch(r"block:\d+", text):  # Megatron-LM's --recompute-method block
        return text
    low = text.lower()
    if "selective recompute of" in low:
        # Megatron's recompute_modules: [layernorm, moe_act] or [layernorm, moe] as a recipe
        # or command lists them, or the ModelZoo tables' 'norm, act'
        named = set(re.findall(r"[a-z_]+", low.split("selective recompute of", 1)[1]))
        modules = [m for m, said in (("layernorm", {"layernorm", "norm"}),
                                     ("moe_act", {"moe_act", "act"}), ("moe", {"moe"}),
                                     ("mla_up_proj", {"mla_up_proj"}), ("mlp", {"mlp"}))
                   if said & named]
        if low.startswith("not stated"):
            flags.append("recompute not stated: the recipe's")
        return "selective:" + "+".join(modules)
    if "activation_checkpointing: true" in low or "activation_checkpointing true" in low:
        flags.append("activation checkpointing predicted as full")
        return "full"
    if low == "not stated" and "torchtitan" in framework.lower() and "70B" in model:
        # torchtitan's Llama 3 70B preset, train_configs/llama3_70b.toml @08e5379:
        # [activation_checkpoint] mode = 'full'
        flags.append("activation checkpointing not stated: full, as torchtitan's 70B preset")
        return "full"
    return "none"


# What the parallelism issue's figures count apart: mixtures of experts with and without
# pipeline stages, and long sequences split by context parallelism.
def layout_of(kwargs: dict[str, Any]) -> str:
    """A case's layout for the report: MoE with or without PP, dense with CP, or dense."""
    if any(isinstance(la, MoE) for la in kwargs["model"].layers):
        return "MoE, PP > 1" if kwargs["pp"] > 1 else "MoE, no PP"
    return "dense, CP > 1" if kwargs["cp"] > 1 else "dense, no CP"


def predict_case(case: dict[str, Any]) -> ThroughputRow:
    """A case predicted. Where the source gives model TFLOP/s by its own FLOP count and the
    case derives tokens/s from it (or from the source's step time), tokens/s are compared:
    counts differ between sources (causal attention at full or half its work), so only the
    source's own count turns its figure back into throughput."""
    derived = case["measured"].get("tokens_per_s_per_gpu")
    measured = float(derived if derived is not None else case["measured"]["value"])
    kwargs, flags, skipped = job_of(case)
    if skipped:
        return ThroughputRow(case["id"], measured, None, flags, skipped)
    stack = kwargs["stack"] if isinstance(kwargs["stack"], str) else kwargs["stack"].name
    where = {"architecture": kwargs["gpu"].architecture, "stack": stack,
             "layout": layout_of(kwargs)}
    try:
        result = estimate(**kwargs)
    except GpusimError as exc:
        return ThroughputRow(case["id"], measured, None, flags, exc.summary, **where)
    step = result.step
    if derived is None and str(case["measured"]["unit"]).startswith("TFLOPS"):
        # model TFLOP/s per GPU, gpusim's FLOP count against the source's own
        per_gpu = step.model_flops_per_step / step.step_time_s / step.num_gpus / 1e12
        flags = (*flags, "TFLOP/s by the source's FLOP count")
    else:
        per_gpu = (step.tokens_per_s or 0.0) / kwargs["num_gpus"]
    return ThroughputRow(case["id"], measured, per_gpu, flags, **where)


def by_group(rows: list[ThroughputRow], key: str) -> dict[str, dict[str, float]]:
    """Per architecture, stack or layout (``key``): cases predicted, mean signed and mean
    absolute error, how many within 15% (the issues' bar), over every predicted row (with an
    assumption or not), and the mean signed error over those as they ran."""
    groups: dict[str, list[ThroughputRow]] = {}
    for r in rows:
        if r.error is not None:
            groups.setdefault(getattr(r, key), []).append(r)
    out = {}
    for name, members in sorted(groups.items()):
        errors = [r.error for r in members if r.error is not None]
        plain = [r.error for r in members if r.error is not None and not r.flags]
        out[name] = {"cases": len(errors), "mean_signed": statistics.fmean(errors),
                     "mape": statistics.fmean(abs(e) for e in errors),
                     "within_15": sum(abs(e) <= WITHIN for e in errors),
                     "as_ran": len(plain),
                     "as_ran_signed": statistics.fmean(plain) if plain else float("nan")}
    return out


def summary(rows: list[ThroughputRow]) -> dict[str, float]:
    """Mean absolute and mean signed error of the rows predicted without a flag (eager)."""
    plain = [r.error for r in rows if r.error is not None and not r.flags]
    if not plain:
        return {"cases": 0}
    return {"cases": len(plain), "mape": statistics.fmean(abs(e) for e in plain),
            "mean_signed": statistics.fmean(plain), "max": max(plain, key=abs)}
