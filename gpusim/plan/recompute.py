"""Activation recompute (checkpointing): what each mode keeps from forward to backward, and
what it runs again before a block's backward.

- ``none`` keeps every tensor the layers save.
- ``selective`` is Megatron-LM's (Korthikanti et al. 2022): only the attention cores re-run,
  so only their score matrices are dropped. With FlashAttention, which keeps no ``seq x
  seq`` matrix, it keeps nearly what ``none`` keeps.
- ``per-op`` is PyTorch's selective activation checkpointing with an op policy, as
  torchtitan applies it (torchtitan/models/llama3/infra/parallelize.py, ``_save_list``):
  each body block is checkpointed, but the outputs of its attention kernel and of every
  other matrix product (the 1st, 3rd, ...; the policy counts ``aten.mm`` calls) are saved;
  norms, activations, adds and the other products re-run. Frameworks write the projections
  unfused (q, k, v and gate, up as products of their own) where gpusim's layers fuse them,
  so the alternation runs over gpusim's products for what re-runs (the 2nd and 4th: output
  and down projections, as in torchtitan's Llama) and memory keeps half of every product's
  output (torchtitan's Llama saves q, v, gate and down: within 10% of that half).
- ``selective:M+M...`` is Megatron-LM's selective recompute of named modules
  (``--recompute-modules``, megatron/core/transformer/transformer_config.py): ``core_attn``
  as ``selective``; ``layernorm`` and ``moe_act`` by output-discarding checkpoints
  (CheckpointWithoutOutput): the norm before a mixture of experts (Transformer Engine fuses
  the others into the product after them, transformer_layer.py: only a norm that is not an
  IdentityOp is recomputed) and the experts' activation drop their outputs after use and
  run again at the start of their consumer's backward; ``moe`` checkpoints each mixture of
  experts whole (transformer_layer.py: the MLP under tensor_parallel.checkpoint): it keeps
  the layer's input and runs its router, dispatch, experts and combine again, all-to-alls
  included, before its backward. ``mla_up_proj`` (output-discarding) drops multi-head latent
  attention's up-projected queries, keys and values after the core has read them and runs
  the up-projections again before the core's backward (multi_latent_attention.py,
  recompute_up_proj); ``mlp`` checkpoints a dense MLP whole, its norm included, keeping its
  input (transformer_layer.py: recompute_mlp, only where the layer is not a mixture of
  experts). ``selective`` is ``selective:core_attn``, Megatron's default list.
- ``full`` checkpoints every body block: it keeps the block's input and re-runs its whole
  forward (Megatron-LM's ``--recompute-granularity full``, torch.utils.checkpoint per block).
- ``every-k:N`` checkpoints every N-th body block (the N-th, 2N-th, ...) fully and keeps
  everything in the others (torchtitan's ``selective_ac_option`` as a number).
- ``block:N`` checkpoints the first N body blocks of each model chunk (a pipeline stage's, or
  the whole model's on one stage) fully and keeps everything in the rest: Megatron-LM's
  ``--recompute-granularity full --recompute-method block --recompute-num-layers N``
  (megatron/core/transformer/transformer_block.py, _checkpointed_forward: layers of the
  chunk below recompute_num_layers are checkpointed).
"""

from __future__ import annotations

from gpusim.errors import InvalidConfig
from gpusim.workload.attention import Attention
from gpusim.workload.layers import Elementwise, Layer, Linear
from gpusim.workload.model import Model
from gpusim.workload.moe import MoE
from gpusim.workload.numerics import Numerics

MODES: tuple[str, ...] = ("none", "selective", "selective:M+M", "per-op", "full",
                          "every-k:N", "block:N")
# Megatron-LM's --recompute-modules that gpusim models, in the order it writes them.
SELECTIVE_MODULES: tuple[str, ...] = ("core_attn", "layernorm", "moe_act", "moe",
                                      "mla_up_proj", "mlp")
# The layers of a block that Megatron-LM's "mla_up_proj" and "mlp" modules re-run, by the
# zoo's names: multi-head latent attention's up-projections, and a dense MLP with the norm
# Transformer Engine fuses into its first product.
MLA_UP_PROJ = (".attn.q_up", ".attn.kv_up")
DENSE_MLP = (".norm2", ".mlp.up", ".mlp.act", ".mlp.down")
HELP = ("activation recompute: none; selective (Megatron-LM: attention cores re-run); "
        "selective:M+M (Megatron-LM's --recompute-modules, of core_attn, layernorm, moe_act, "
        "moe, mla_up_proj, mlp: e.g. selective:layernorm+moe_act); per-op (PyTorch's "
        "op-policy checkpointing: "
        "matrix-product and attention outputs saved, the rest re-run); full (each block "
        "re-runs); every-k:N (every N-th block re-runs); block:N (the first N blocks of each "
        "pipeline chunk re-run, Megatron-LM's --recompute-method block)")


def parse_recompute(text: str) -> str:
    """A recompute mode from what a user wrote ("every-k:2", "full", ...), checked."""
    mode = str(text).strip().lower()
    if mode in ("none", "selective", "per-op", "full"):
        return mode
    if mode.startswith("selective:"):
        named = [m.strip() for m in mode.split(":", 1)[1].split("+") if m.strip()]
        unknown = [m for m in named if m not in SELECTIVE_MODULES]
        if unknown or not named:
            raise InvalidConfig(f"selective:M+M names Megatron-LM's recompute modules, of "
                                f"{', '.join(SELECTIVE_MODULES)} (got {text!r}), e.g. "
                                f"selective:layernorm+moe_act")
        chosen = [m for m in SELECTIVE_MODULES if m in named]
        return "selective" if chosen == ["core_attn"] else "selective:" + "+".join(chosen)
    if mode.startswith("every-k:"):
        value = mode.split(":", 1)[1]
        if not value.isdigit() or int(value) < 1:
            raise InvalidConfig(f"every-k:N needs a whole number of blocks N >= 1 (got "
                                f"{value!r}), e.g. every-k:2 checkpoints every second block")
        return "full" if int(value) == 1 else f"every-k:{int(value)}"
    if mode.startswith("block:"):
        value = mode.split(":", 1)[1]
        if not value.isdigit():
            raise InvalidConfig(f"block:N needs a whole number of blocks N >= 0 (got "
                                f"{value!r}), e.g. block:5 re-runs the first five blocks of "
                                f"each pipeline chunk")
        return "none" if int(value) == 0 else f"block:{int(value)}"
    raise InvalidConfig(f"unknown recompute mode {text!r}; use one of {', '.join(MODES)}")


def selective_modules(mode: str) -> frozenset[str]:
    """The modules a selective mode re-runs in backward (none for the other modes)."""
    if mode == "selective":
        return frozenset({"core_attn"})
    if mode.startswith("selective:"):
        return frozenset(mode.split(":", 1)[1].split("+"))
    return frozenset()


def recomputed_norm(layer: Layer, reader: Layer | None, modules: frozenset[str]) -> bool:
    """Whether ``layer`` is a norm that ``layernorm`` recompute re-runs: one before a mixture
    of experts (before a product, Transformer Engine fuses it into the product)."""
    return ("layernorm" in modules and isinstance(layer, Elementwise)
            and layer.op in ("layer_norm", "rms_norm") and isinstance(reader, MoE))


def activation_only(layer: Layer, mode: str) -> bool:
    """Whether a re-run of ``layer`` under ``mode`` is its experts' activation alone (a
    selective mode without ``moe``, which re-runs the whole layer), which exchanges
    nothing."""
    modules = selective_modules(mode)
    return isinstance(layer, MoE) and bool(modules) and "moe" not in modules


def rerun_with(layer: Layer, block_layers: list[Layer], modules: frozenset[str]
               ) -> list[Layer]:
    """The layers of ``layer``'s block that re-run just before ``layer``'s backward under
    the ``mla_up_proj`` and ``mlp`` modules: the up-projections before the attention core's,
    the dense MLP (a block without a mixture of experts) before its last product's."""
    if "mla_up_proj" in modules and isinstance(layer, Attention):
        return [la for la in block_layers if la.name.endswith(MLA_UP_PROJ)]
    if ("mlp" in modules and layer.name.endswith(DENSE_MLP[-1])
            and not any(isinstance(la, MoE) for la in block_layers)):
        return [la for la in block_layers if la.name.endswith(DENSE_MLP)]
    return []


def recomputed_moe(layer: Layer, modules: frozenset[str]) -> bool:
    """Whether a selective mode re-runs ``layer`` before its backward: a mixture of experts
    whole (moe) or its experts' activation (moe_act)."""
    return isinstance(layer, MoE) and bool({"moe", "moe_act"} & modules)


def checkpointed_blocks(mode: str, model: Model) -> frozenset[str]:
    """Body blocks that the mode wraps in a checkpoint (their forward runs again)."""
    if mode == "none" or mode.startswith("selective"):
        return frozenset()
    body = [block[0].block for block in model.partition()[1] if block[0].block]
    if mode.startswith("every-k:"):
        k = int(mode.split(":", 1)[1])
        body = [b for i, b in enumerate(body) if (i + 1) % k == 0]
    elif mode.startswith("block:"):  # ``model``: the chunk's layers under pipeline stages
        body = body[:int(mode.split(":", 1)[1])]
    return frozenset(body)


def policy_saved(mode: str, block_layers: list[Layer]) -> frozenset[str]:
    """Layers of a checkpointed block whose outputs the per-op policy saves (they do not
    re-run): attention kernels, and every other matrix product in forward order."""
    if mode != "per-op":
        return frozenset()
    saved = {la.name for la in block_layers if isinstance(la, Attention)}
    linears = [la.name for la in block_layers if isinstance(la, Linear)]
    saved.update(linears[::2])
    return frozenset(saved)


def policy_kept_bytes(layer: Layer, n: int, num: Numerics) -> float:
    """What the per-op policy keeps of a checkpointed block's ``layer``: an attention
    kernel's output and fp32 log-sum-exp per row, half of a matrix product's output."""
    if isinstance(layer, Attention):
        return float(n * layer.out_elements * num.act_bytes + n * layer.heads * layer.seq * 4)
    if isinstance(layer, Linear):
        return n * layer.out_elements * num.act_bytes / 2
    return 0.0
