"""Published, measured per-GPU peak memories (published/peak_memory.yaml), and gpusim's
prediction of each.

The figures are validation only, never fitted. Each case is turned into the job it
describes, written as its framework writes the layers (its stack);
a case that needs what gpusim does not model yet (CPU offload, Adafactor, a model outside
the zoo's families) is listed with the
reason instead of being forced into a job it is not. A figure is compared with what it
measured: ``allocated`` with the allocated peak, ``reserved`` (and ``unknown``: frameworks
print the reserved peak) with the caching allocator's reserved peak, ``nvidia-smi`` with the
reserved peak plus the CUDA context and library handles the process holds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpusim.data import data_dir
from gpusim.errors import GpusimError
from gpusim.estimation import build_job
from gpusim.explore.values import with_fields
from gpusim.hardware.catalog import load_gpu
from gpusim.hardware.profile import DeviceProfile
from gpusim.plan.memory import FRAMEWORK_RESERVED_BYTES, MemoryPlan
from gpusim.plan.memory_report import peak_plan
from gpusim.stack import Stack, load_stack
from gpusim.validate.published_throughput import model_of
from gpusim.validate.torchtitan import MID_2025_COMMITS, torchtitan_pipeline
from gpusim.workload import zoo
from gpusim.workload.model import Model
from gpusim.workload.zoo.transformer import TransformerConfig, build_transformer

CASES_FILE = data_dir("published") / "peak_memory.yaml"

# GPU names as the sources write them -> (profile, memory GiB when it differs)
GPUS: list[tuple[str, str, float | None]] = [
    ("H100 SXM 96GB", "h100-sxm-96gb", None), ("H100 96GB", "h100-sxm-96gb", None),
    ("H200", "h200", None), ("A100-SXM4-40GB", "a100-40gb", None),
    ("A100 80GB", "a100-80gb", None), ("A800", "a100-80gb", None),
    ("V100-SXM2 16GB", "v100-sxm2-16gb", None), ("A10G", "a10", None),
    ("H100 SXM5 80GB", "h100-sxm", None), ("A100 40GB", "a100-40gb", None),
    ("MI300X", "mi300x", None), ("B200", "b200", None),
    ("RTX 4070 Ti SUPER", "rtx-4070-ti-super", None),
]
RECOMPUTE = {"selective(op)": "per-op", "megatron-selective": "selective", "none": "none"}
# The framework a source names -> the stack that writes its layers (stacks/). ms-swift's
# DeepSpeed runs train the Hugging Face model; torchtitan before March 2025 upcast its norms
# and left its loss eager.
STACKS = [("transformers (aug 2022)", "hf-transformers-2022"),
          ("megatron", "megatron"), ("deepspeed", "hf-transformers"),
          ("transformers ~v4.16", "hf-transformers-2022"), ("hf trainer", "hf-transformers"),
          ("lit-gpt @", "litgpt-2023"), ("lit", "litgpt"), ("torchtune", "torchtune"),
          ("torchtitan @9dec370", "torchtitan-2024"),
          # torchtitan 0.0.2 beside torch 2.7.0a0 and torchao 0.10 dev builds: early 2025,
          # before its loss was compiled (bbb1b616e, 2025-04-02)
          ("torchtitan 0.0.2", "torchtitan-2024"),
          # torchtitan of June to August 2025: nn.RMSNorm and a compiled loss, K/V still
          # repeated
          *[(f"torchtitan @{c}", "torchtitan-2025") for c in MID_2025_COMMITS],
          ("torchtitan", "torchtitan")]


@dataclass(frozen=True)
class MemoryCase:
    id: str
    kind: str  # allocated | reserved | nvidia-smi | unknown
    measured_gib: float
    source: str
    job: Any = None  # the job gpusim runs, None when it cannot be expressed
    skipped: str = ""  # why not

    def predicted_gib(self) -> float:
        return measured_like(peak_plan(self.job), self.kind) / 2**30

    def fits(self) -> bool:
        return peak_plan(self.job).fits


def measured_like(plan: MemoryPlan, kind: str) -> float:
    """The predicted figure that a measurement of ``kind`` reports."""
    if kind == "allocated":
        return plan.peak_bytes
    if kind == "nvidia-smi":
        return plan.reserved_bytes + FRAMEWORK_RESERVED_BYTES
    return plan.reserved_bytes


def load_cases(path: Path = CASES_FILE) -> list[MemoryCase]:
    data = yaml.safe_load(path.read_text())
    cases = []
    for row in data["cases"]:
        src = row["source"]
        base = {"id": row["id"], "kind": row["memory_kind"],
                "measured_gib": float(row["measured_gib"]),
                "source": f"{src['url_or_repo_path']} ({src['where']})"}
        why = _unsupported(row)
        if why:
            cases.append(MemoryCase(**base, skipped=why))
            continue
        try:
            cases.append(MemoryCase(**base, job=_job(row)))
        except GpusimError as exc:
            cases.append(MemoryCase(**base, skipped=f"not expressible: {exc}"))
    return cases


def _unsupported(row: dict[str, Any]) -> str:
    """Why gpusim cannot model this case yet ('' when it can)."""
    m = row["model"]
    checks = [
        (bool(row.get("excluded")), str(row.get("excluded", ""))),
        (_method(row)[0] not in ("full", "lora", "qlora"), "the fine-tuning method is not "
                                                             "one gpusim models"),
        ("deepspeed fp16" in str(row.get("framework", "")).lower(),
         "DeepSpeed's fp16 engine is not modelled: the model held in fp16 without autocast "
         "(so a 2022 Hugging Face loss runs on fp16 logits) and an fp32 copy of each "
         "gradient shard in the optimizer step"),
        (_model(m) is None, f"{m['name']} is not a transformer gpusim builds"),
        (_gpu(row["hardware"]["gpu"]) is None, f"no profile for {row['hardware']['gpu']}"),
    ]
    return next((why for bad, why in checks if bad), "")


def _method(row: dict[str, Any]) -> tuple[str, int, tuple[str, ...]]:
    """(full, lora or qlora; the adapters' rank; their targets) from a case's method."""
    text = str(row.get("method", "full")).lower()
    if text.startswith("full"):
        return "full", 0, ()
    kind = "qlora" if text.startswith("qlora") else "lora" if text.startswith("lora") else text
    rank = re.search(r"(?:r=|rank )(\d+)", text)
    targets = ["q", "v"] if ("q+v" in text or "q_proj/v_proj" in text) else []
    if "output_proj" in text:
        targets.append("o")
    if "mlp" in text:
        targets += ["gate", "up", "down"]
    return kind, int(rank.group(1)) if rank else 8, tuple(targets or ("q", "v"))


def _gpu(name: str) -> DeviceProfile | None:
    for text, profile, memory in GPUS:
        if text.lower() in name.lower():
            gpu = load_gpu(profile)
            return with_fields(gpu, {"memory_gib": memory}) if memory else gpu
    return None


def _vision_transformer(m: dict[str, Any]) -> Model | None:
    """A timm ViT as a case states it: its patch size from the name (ViT-H/14), its
    sequence (patches and the class token) at a square input; classified over the zoo's
    1000 classes (the cases' 45-class heads are a thousandth of the model)."""
    patch = re.search(r"/(\d+)", str(m["name"]))
    seq = int(m.get("seq_len") or 0)
    side = math.isqrt(max(seq - 1, 0))
    if patch is None or side * side != seq - 1 or \
            not all(m.get(k) for k in ("layers", "hidden", "heads", "ffn_hidden")):
        return None
    gated = bool(m.get("gated_mlp"))
    return build_transformer(TransformerConfig(
        name=m["name"], kind="vision", layers=m["layers"], hidden=m["hidden"],
        heads=m["heads"], ffn_hidden=m["ffn_hidden"], image_size=side * int(patch[1]),
        patch_size=int(patch[1]), norm="layernorm", positions="learned",
        activation="swiglu" if gated else "gelu", tied_embeddings=False, bias=True))


def _model(m: dict[str, Any]) -> Model | None:
    name = str(m["name"]).lower()
    if name.startswith("bert-large"):
        return zoo.get("bert-large", seq_len=int(m["seq_len"]))
    if "vit" in name:
        return _vision_transformer(m)
    if m.get("experts"):  # a mixture of experts, as the throughput cases build one
        return model_of(m, int(m["seq_len"]))
    if not all(m.get(k) for k in ("layers", "hidden", "heads", "vocab", "seq_len")):
        return None
    gated = bool(m.get("gated_mlp"))
    cfg = TransformerConfig(
        name=m["name"], layers=m["layers"], hidden=m["hidden"], heads=m["heads"],
        kv_heads=m.get("kv_heads"), ffn_hidden=m.get("ffn_hidden"), vocab=m["vocab"],
        seq_len=m["seq_len"], norm="rmsnorm" if gated else "layernorm",
        activation="swiglu" if gated else "gelu", positions="rotary" if gated else "learned",
        tied_embeddings=bool(m.get("tied_embeddings")), bias=not gated,
        dropout=bool(m.get("dropout")),
        # Phi: attention and MLP in parallel on one norm's output (litgpt's phi-1_5 config:
        # parallel_residual, shared_attention_norm)
        parallel_residual="phi" in name, shared_norm="phi" in name)
    return build_transformer(cfg)


def _job(row: dict[str, Any]) -> Any:
    t, p, m = row["training"], row["parallelism"], row["model"]
    gpus = int(row["hardware"]["num_gpus"])
    precision_text = str(t["precision"]).lower()
    precision = "fp8" if "float8" in precision_text else "fp16" if "fp16" in precision_text \
        else "bf16" if "bf16" in precision_text else "fp32"
    opt = str(t.get("optimizer", "adamw")).lower()
    optimizer = "adamw8bit" if "8-bit" in opt else "adafactor" if "adafactor" in opt \
        else "adamw"
    ac = str(t.get("activation_checkpointing", "none"))
    recompute = RECOMPUTE.get(ac, "full" if ac.startswith("full") else ac)
    micro = int(t["microbatch_per_gpu"])
    tp, pp, cp = int(p.get("tp") or 1), int(p.get("pp") or 1), int(p.get("cp") or 1)
    dp = gpus // (tp * pp * cp)
    sharding = str(p.get("zero_stage_or_fsdp", "")).upper()
    zero = 3 if ("FSDP" in sharding or "ZERO-3" in sharding) else \
        1 if "ZERO-1" in sharding else 2 if "ZERO-2" in sharding else 0
    if zero == 3 and pp > 1:
        # FSDP under pipeline stages: torch.distributed.pipelining runs every microbatch
        # but the last without gradient sync or resharding (backward_maybe_with_nosync),
        # so unsharded gradients accumulate and only the optimizer states stay sharded: as
        # ZeRO-1 keeps them (the throughput benchmark maps it the same way)
        zero = 1
    method, rank, targets = _method(row)
    framework = str(row.get("framework", "")).lower()
    name = next((st for text, st in STACKS if text in framework), "pytorch")
    stack: str | Stack = name
    if "torch fused" in opt:  # torch.optim's fused AdamW: no temporary of the states' size
        stack = load_stack(name).model_copy(update={"optimizer": "fused"})
    if "standard" in str(t.get("loss", "")):  # the recipe's loss set to plain cross-entropy
        # Unchunked, torchtune's TransformerDecoder casts the logits itself
        # (output = self.output(h).float(), modules/transformer.py), so a compiled loss gets
        # fp32 logits and keeps what the eager one does.
        stack = load_stack(name).model_copy(update={"loss_chunks": 1, "compile_loss": False})
    options: dict[str, Any] = {
        "precision": precision, "optimizer": optimizer, "checkpointing": recompute,
        "pure_bf16": "pure" in precision_text, "loader_workers": 0, "stack": stack,
        "compile": t.get("torch_compile") is True,
        "fp8_recipe": "rowwise" if "rowwise" in precision_text else "tensorwise",
        "finetune": method, "lora_rank": rank or 8, "lora_targets": targets,
        # LitGPT's LoRA recipes default to an adapter dropout of 0.05 (finetune/lora.py)
        "lora_dropout": method != "full" and name.startswith("litgpt"),
        # torchtune's optimizer_in_bwd and enable_activation_offloading
        "optimizer_in_backward": (t.get("optimizer_in_backward") is True
                                  or "fused into backward" in opt),
        "offload_activations": t.get("activation_offloading") is True,
        # torchao's CPUOffloadOptimizer (offload_gradients off): the states and the step on
        # the host, gradients made on the device, as --offload optimizer holds them
        "offload": "optimizer" if p.get("cpu_offload") or "offload" in opt else "none",
        # Megatron's --grad-reduce-in-bf16 (Megatron-Bridge's grad_reduce_in_fp32 false)
        "bf16_grads": str(t.get("grad_reduce", "")).startswith("bf16")}
    if int(p.get("ep") or 1) > 1:
        options["ep"] = int(p["ep"])
    model, gpu = _model(m), _gpu(row["hardware"]["gpu"])
    assert model is not None and gpu is not None  # _unsupported checked both
    accum = int(t.get("grad_accum") or 1)
    if gpus == 1:
        return build_job(model, gpu, micro * accum, grad_accum=accum, **options)[0]
    local = micro
    schedule = str(p.get("schedule") or "1f1b")
    virtual = int(p.get("virtual_stages") or 1)
    if pp > 1 and "torchtitan" in framework:
        local, micro, schedule, virtual, options["pp_layers"] = torchtitan_pipeline(
            t, pp, micro, int(m["layers"]))
    return build_job(model, gpu, local * dp * accum, num_gpus=gpus,
                     tp=tp, pp=pp, dp=dp, cp=cp, microbatch_size=micro, zero=zero,
                     sequence_parallel=bool(p.get("sp")), schedule=schedule,
                     virtual_stages=virtual, **options)[0]
