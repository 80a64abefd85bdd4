"""Flags more than one command takes, defined once: the job (model, device, batch,
techniques, split), the run's length, precision and price."""

from __future__ import annotations

import argparse

from gpusim import numbers
from gpusim.plan.job import DEFAULT_LOADER_WORKERS, OPTIMIZERS, TRAINING_PRECISIONS
from gpusim.plan.offload import OFFLOADS
from gpusim.plan.parallel_job import SCHEDULES, ZERO_STAGES
from gpusim.plan.recompute import HELP as RECOMPUTE_HELP
from gpusim.stack import ATTENTION_KERNELS
from gpusim.workload.fp8 import FP8_RECIPES

PRECISIONS = ("auto", *TRAINING_PRECISIONS)
PRECISION_HELP = ("auto (default): the device's fastest mixed precision, bf16 where its "
                  "matrix units take it, else fp16, else fp32")


def add_precision_flag(p: argparse.ArgumentParser | argparse._ArgumentGroup,
                       default: str | None = "auto") -> None:
    """--precision, with the same default (auto) in every command."""
    p.add_argument("--precision", default=default, choices=PRECISIONS, help=PRECISION_HELP)


def add_price_flag(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--usd-per-gpu-hour", type=numbers.nonnegative, metavar="USD",
                   help="price the run at this rate per device-hour (default: the profile's "
                        "cheapest listed on-demand price, from an 8-GPU instance once the job "
                        "fills one; the output names it)")


def add_run_length_flags(p: argparse.ArgumentParser) -> None:
    """--epochs/--dataset-size, --tokens or --steps: how long the run is."""
    length = p.add_argument_group("run length (one of; default one step)")
    length.add_argument("--epochs", type=numbers.positive,
                        help="epochs over --dataset-size samples")
    length.add_argument("--dataset-size", type=numbers.count, help="samples per epoch")
    length.add_argument("--tokens", type=numbers.positive, help="training tokens (language models)")
    length.add_argument("--steps", type=numbers.count, help="optimizer steps")


def add_loader_flag(p: argparse.ArgumentParser | argparse._ArgumentGroup,
                    default: int | None = DEFAULT_LOADER_WORKERS) -> None:
    p.add_argument("--loader-workers", type=numbers.count0, default=default,
                   help=f"data-loader worker processes per data-parallel replica (default "
                        f"{DEFAULT_LOADER_WORKERS}; 0: synthetic data on the device)")


def add_torch_model_flags(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """How to run a PyTorch model named as --model package.module:function."""
    p.add_argument("--input-shape", type=numbers.count_list, metavar="B,...",
                   help="with --model package.module:function (a PyTorch module built on the "
                        "meta device): the example input's shape, batch first, e.g. "
                        "8,3,224,224")
    p.add_argument("--input-ids", action="store_true",
                   help="the example input holds token ids (integers), as a language model "
                        "takes")


def add_json_flag(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")


DIMENSIONS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab")


def add_job_flags(e: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The flags that describe a training job (model, device, batch, techniques, split),
    shared by estimate and memory; returns the "many GPUs" group for more."""
    e.add_argument("--model", required=True,
                   help="zoo name (gpusim models list), a model YAML file, a Hugging Face "
                        "config.json, 'transformer' with --layers/--hidden/--heads, or a "
                        "PyTorch module as package.module:function with --input-shape")
    add_torch_model_flags(e)
    e.add_argument("--gpu",
                   help="GPU or CPU profile name or alias (gpusim profiles list), or a YAML "
                        "file; with --system, its GPU")
    e.add_argument("--power-limit", type=numbers.real(0, above=True), metavar="W",
                   help="board power limit of each GPU in watts, as nvidia-smi -pl sets it "
                        "(default: the profile's, which is its TDP unless the part ships "
                        "lower): dense matrix work runs at the clock that fits it")
    e.add_argument("--batch-size", type=numbers.count, required=True,
                   help="samples per optimizer step (the global batch over all GPUs)")
    add_precision_flag(e)
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
    tech.add_argument("--compile", action="store_true",
                      help="run the model under torch.compile: TorchInductor fuses norms, "
                           "activations, residual adds and casts into generated kernels, and "
                           "the host launches them without per-op Python")
    tech.add_argument("--fp8-recipe", choices=FP8_RECIPES, default="tensorwise",
                      help="with --precision fp8 (linear layers only; attention, norms and "
                           "the head stay bf16): tensorwise (default; torchao), rowwise, "
                           "delayed (Transformer Engine), mxfp8 or blockwise (DeepSeek-V3's "
                           "1x128/128x128, Transformer Engine's Float8BlockScaling) scaling, "
                           "each with its cast and scale kernels")
    tech.add_argument("--attention", choices=ATTENTION_KERNELS,
                      help="attention kernel: auto (SDPA's choice on the GPU; the stack's "
                           "default), flash2 (FlashAttention-2), cudnn, efficient, triton "
                           "(FlashAttention's Triton kernel, llm-foundry's), or math "
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
    tech.add_argument("--optimizer-in-backward", action="store_true",
                      help="step each parameter as soon as its gradient is accumulated and "
                           "free the gradient (torchtune's optimizer_in_bwd): about one "
                           "layer's gradients alive instead of all; one GPU, no --grad-accum")
    tech.add_argument("--offload-activations", action="store_true",
                      help="copy the tensors saved for backward to pinned host memory during "
                           "forward and back during backward (torchtune's "
                           "enable_activation_offloading); transfer time beyond compute is "
                           "exposed; one GPU")
    tech.add_argument("--pure-bf16", action="store_true",
                      help="hold the model in bf16: weights, gradients and optimizer states, "
                           "no fp32 copies (torchtune, LitGPT bf16-true); needs --precision "
                           "bf16")
    tech.add_argument("--grad-reduce-in-bf16", action="store_true",
                      help="accumulate and reduce gradients in bf16, not fp32 (Megatron-LM's "
                           "--grad-reduce-in-bf16, Megatron-Bridge's ddp.grad_reduce_in_fp32 "
                           "false): half the gradient buffer and data-parallel traffic; "
                           "with bf16 or fp8")
    tech.add_argument("--bf16-optimizer-states", action="store_true",
                      help="keep the optimizer's states in bf16: Adam's moments and, with "
                           "master weights, its copy of the weights (apex "
                           "DistributedFusedAdam with dtype bf16); with 16-bit or fp8 "
                           "training")
    tech.add_argument("--channels-last", action="store_true",
                      help="a CNN's tensors channels-last (model.to(memory_format="
                           "torch.channels_last)): no transposes around cuDNN's tensor-core "
                           "convolutions")
    tech.add_argument("--freeze", default="",
                      help="comma-separated layer-name prefixes to freeze (e.g. embed,h.0)")
    add_loader_flag(tech)
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
    many.add_argument("--pp-layout", metavar="LAYOUT", default="",
                      help="Megatron-LM's pipeline layout string (--pipeline-model-parallel-"
                           "layout), e.g. 'Et|(tt|)*30mL': chunks split by '|', E the "
                           "embedding, t a block, m multi-token prediction, L the loss")
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
    many.add_argument("--etp", type=numbers.count, default=0,
                      help="expert tensor parallelism: tensor-parallel GPUs that split each "
                           "expert (Megatron-LM's --expert-tensor-parallel-size); fewer than "
                           "--tp folds EP over tensor x data GPUs, innermost first (default: "
                           "TP while EP fits inside data parallelism)")
    many.add_argument("--ep-overlap", action="store_true",
                      help="run expert-parallel all-to-alls beside another microbatch's "
                           "compute (Megatron-LM's --overlap-moe-expert-parallel-comm; needs "
                           "--ep > 1)")
    many.add_argument("--moe-imbalance", type=float, default=1.0, metavar="F",
                      help="the busiest expert-parallel rank's tokens over the mean "
                           "(default 1: balanced routing, as forced load balancing gives; "
                           "dropless runs with learned routing load some ranks more, and "
                           "every rank waits for the busiest at each all-to-all)")
    many.add_argument("--capacity-factor", type=float, metavar="C",
                      help="experts take at most C x the mean token copies and drop the "
                           "rest (Megatron-LM's --moe-expert-capacity-factor; default: "
                           "dropless)")
    many.add_argument("--pad-to-capacity", action="store_true",
                      help="with --capacity-factor: every expert computes exactly its "
                           "capacity, padding (--moe-pad-expert-input-to-capacity)")
    many.add_argument("--ep-dispatcher", choices=("alltoall", "deepep", "hybridep"),
                      default="alltoall",
                      help="how tokens reach their experts: alltoall (a copy per chosen "
                           "expert, NCCL's all-to-all) or deepep (DeepEP: a copy per "
                           "destination rank inside a node, per destination node across "
                           "nodes; Megatron-LM's --moe-enable-deepep) or hybridep "
                           "(NVIDIA's HybridEP, hierarchical the same way, costed alike)")
    many.add_argument("--no-overlap-grad-reduce", action="store_true",
                      help="reduce data-parallel gradients after the backward pass, not "
                           "during it")
    add_transformer_flags(e)
    return many


def add_transformer_flags(p: argparse.ArgumentParser) -> None:
    """The dimensions and flavour of --model transformer."""
    dims = p.add_argument_group("transformer dimensions (with --model transformer)")
    for name in (*DIMENSIONS, "head_dim"):
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
    dims.add_argument("--experts", type=numbers.count,
                      help="a mixture of experts: every block's MLP becomes this many expert "
                           "MLPs (of --expert-ffn-hidden each), --top-k of them per token")
    dims.add_argument("--top-k", type=numbers.count, help="experts per token (default 2)")
    dims.add_argument("--expert-ffn-hidden", type=numbers.count,
                      help="each expert's hidden width (default --ffn-hidden)")
    dims.add_argument("--shared-ffn-hidden", type=numbers.count,
                      help="shared experts' hidden width in all, run for every token "
                           "(DeepSeek, Qwen2-MoE; default none)")
    dims.add_argument("--moe-every", type=numbers.count,
                      help="with --experts: every N-th block has experts, the others a dense "
                           "MLP of --ffn-hidden (Megatron-LM's --moe-layer-freq N; default 1: "
                           "every block)")
    dims.add_argument("--dense-layers", type=numbers.count0,
                      help="with --experts: the first blocks keep a dense MLP (DeepSeek)")
