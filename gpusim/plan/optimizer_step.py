"""The optimizer step as kernels: the elementwise passes PyTorch's optimizers make over each
parameter tensor (foreach kernels on a GPU, a loop on a CPU), Megatron-LM's fused update
around its fp32 main weights, and torchtune's step inside the backward pass.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from gpusim.plan.job import TrainingJob
from gpusim.workload.layers import Layer
from gpusim.workload.ops import Op, memory_op

# PyTorch's foreach optimizers handle about this many tensors per fused kernel launch.
TENSORS_PER_OPTIMIZER_KERNEL = 100

# The elementwise passes PyTorch's optimizers make over each parameter tensor, as
# torch/optim/adam.py and sgd.py write them (the single-tensor loop that CPU tensors take and
# the foreach kernels CUDA tensors take run the same passes): (op, tensors read, tensors
# written, whether the result is a new tensor). Adam's ``step += 1`` is a one-element op.
Pass = tuple[str, float, float, bool]
_ADAM: list[Pass] = [("step", 0, 0, False), ("lerp_", 2, 1, False), ("mul_", 1, 1, False),
                     ("addcmul_", 2, 1, False), ("sqrt", 1, 1, True), ("div", 1, 1, True),
                     ("add_", 1, 1, False), ("addcdiv_", 3, 1, False)]
OPTIMIZER_PASSES: dict[str, list[Pass]] = {
    "adam": _ADAM,
    "adamw": [("mul_", 1, 1, False), *_ADAM],  # decoupled weight decay first
    "sgd": [("add_", 2, 1, False)],
    "sgd-momentum": [("mul_", 1, 1, False), ("add_", 2, 1, False), ("add_", 2, 1, False)],
    # bitsandbytes' AdamW8bit: one fused kernel reads the weight, its gradient and two
    # 1-byte states, and writes the weight and the states (in fp32-element units).
    "adamw8bit": [("adam_8bit", 2.5, 1.5, False)],
    # Hugging Face's Adafactor as its Trainer builds it (transformers/optimization.py,
    # Adafactor.step; no first moment, beta1 None): the weight's RMS, the squared gradient
    # plus eps, its row and column means into the factored moments, their outer product
    # times the gradient, clipped by its own RMS, scaled by the learning rate, subtracted.
    "adafactor": [("step", 0, 0, False), ("rms", 1, 0, False), ("pow", 1, 1, True),
                  ("add", 1, 1, True), ("mean_rows", 1, 0, False), ("mean_cols", 1, 0, False),
                  ("outer", 0, 1, True), ("mul_", 2, 1, False), ("rms", 1, 0, False),
                  ("div_", 1, 1, False), ("mul_", 1, 1, False), ("neg", 1, 1, True),
                  ("add_", 2, 1, False)],
}

# DeepLearningExamples' BertAdam (PyTorch/LanguageModeling/BERT/optimization.py @729963dd4,
# BertAdam.step), a Python loop over the parameters: each gradient clipped by its own norm
# (torch.nn.utils.clip_grad_norm_ on the one tensor: its norm, the norm of that norm, the
# clip coefficient and its clamp as one-element ops, then the gradient scaled), the moments'
# updates in place, then the update as separate ops: m / (sqrt(v) + eps), plus
# weight_decay * p where the parameter decays, times the scheduled learning rate, negated and
# added to the weight. A pass reading and writing nothing is a one-element op.
_BERT_CLIP: list[Pass] = [("clip_norm", 1, 0, False), ("clip_stack", 0, 0, True),
                          ("clip_total_norm", 0, 0, True), ("clip_add_eps", 0, 0, True),
                          ("clip_coef", 0, 0, True), ("clip_clamp", 0, 0, True),
                          ("clip_mul_", 1, 1, False)]
_BERT_UPDATE: list[Pass] = [("mul_", 1, 1, False), ("add_", 2, 1, False), ("mul_", 1, 1, False),
                            ("addcmul_", 2, 1, False), ("sqrt", 1, 1, True),
                            ("add", 1, 1, True), ("div", 2, 1, True)]
_BERT_DECAY: list[Pass] = [("decay_mul", 1, 1, True), ("decay_add_", 2, 1, False)]
_BERT_APPLY: list[Pass] = [("lr_mul", 1, 1, True), ("neg", 1, 1, True), ("add_", 2, 1, False)]
# run_squad.py's optimizer_grouped_parameters: no decay for 'bias', 'LayerNorm.bias' and
# 'LayerNorm.weight', the vectors; the weight matrices and embeddings decay.
BERT_ADAM_PASSES = {"decayed": _BERT_CLIP + _BERT_UPDATE + _BERT_DECAY + _BERT_APPLY,
                    "not_decayed": _BERT_CLIP + _BERT_UPDATE + _BERT_APPLY}

# Megatron-LM's mixed-precision optimizer (Float16OptimizerWithFloat16Params) around apex's
# fused multi-tensor kernels, in fp32-element units (0.5: a 16-bit tensor). fp16 gradients
# are copied into fp32 main gradients and unscaled (bf16 ones accumulate in fp32 already);
# one norm pass for gradient clipping; one fused update of the fp32 main weights and states;
# the updated weights copied back into the 16-bit model.
_FUSED_UPDATE = {"adam": ("fused_adam", 4, 3), "adamw": ("fused_adam", 4, 3),
                 "sgd": ("fused_sgd", 2, 1), "sgd-momentum": ("fused_sgd", 3, 2),
                 "adamw8bit": ("adam_8bit", 2.5, 1.5)}


def _megatron_passes(job: TrainingJob) -> tuple[list[Pass], Pass, list[Pass]]:
    """The passes before the update, the fused update, the passes after it."""
    name, reads, writes = _FUSED_UPDATE[job.optimizer]
    if job.bf16_states and job.optimizer != "adamw8bit":
        # the master copy and the states in bf16: half of each fp32 unit but the gradient's
        reads, writes = 1 + (reads - 1) / 2, writes / 2
    scaled: list[Pass] = [("copy_main_grads", 0.5, 1, True), ("unscale_", 1, 1, False)]
    return ([*(scaled if job.precision == "fp16" else []), ("grad_norm", 1, 0, False)],
            (name, reads, writes, False), [("copy_main_params", 1, 0.5, False)])


def step_in_backward_ops(job: TrainingJob, layer: Layer) -> list[Op]:
    """The optimizer step of ``layer``'s parameters inside the backward pass: torchtune
    gives each parameter an optimizer of its own and steps it from its post-accumulate-grad
    hook (torchtune/modules/optim.py, OptimizerInBackward; torchtune/training/memory.py,
    register_optim_in_bwd_hooks), so each pass is a kernel per tensor, the same work as
    the whole step's."""
    if not (layer.params and job.is_trainable(layer.name)):
        return []
    passes = list(OPTIMIZER_PASSES[job.optimizer])
    return [op for size in layer.tensor_sizes()
            for op in pass_ops(passes, [size], job.device.is_gpu, 2 if job.pure_bf16 else 4,
                               prefix=f"{layer.name}.")]


def parameter_tensors(layers: Iterable[Layer], is_trainable: Callable[[str], bool]
                      ) -> list[int]:
    """Element counts of the parameter tensors the optimizer steps, layer by layer."""
    return [size for lay in layers if lay.params and is_trainable(lay.name)
            for size in lay.tensor_sizes()]


def _bert_adam_ops(job: TrainingJob, gpu: bool) -> list[Op]:
    """BertAdam's loop: a kernel per pass per tensor, the matrices with weight decay."""
    matrices: list[int] = []
    vectors: list[int] = []
    for lay in job.model.layers:
        if lay.params and job.is_trainable(lay.name):
            for size, factored in zip(lay.tensor_sizes(), lay.factored_sizes(), strict=True):
                # a matrix's factored moment (its row and column sums) is smaller than it
                (matrices if factored < size else vectors).append(size)
    return [*pass_ops(BERT_ADAM_PASSES["decayed"], matrices, gpu, per_tensor=True),
            *pass_ops(BERT_ADAM_PASSES["not_decayed"], vectors, gpu, per_tensor=True,
                      prefix="no_decay.")]


def optimizer_ops(job: TrainingJob) -> list[Op]:
    """The optimizer step over the trainable tensors, pass by pass: on a GPU each pass is a
    few foreach kernels over lists of tensors; on a CPU, or where the stack's optimizer
    loops over the tensors (``per_tensor``), one op per tensor. With master weights,
    Megatron-LM's optimizer and its fused kernels; a per-tensor optimizer over the fp32
    masters instead updates them tensor by tensor (apex amp O2 around a Python loop)."""
    sizes = parameter_tensors(job.model.layers, job.is_trainable)
    if not sizes:
        return []
    per_tensor = job.framework.optimizer in ("per_tensor", "bert_adam")
    gpu = job.device.is_gpu
    bert_adam = (job.framework.optimizer == "bert_adam" and job.optimizer in ("adam", "adamw")
                 and not job.master_weights)
    if bert_adam:
        return _bert_adam_ops(job, gpu)
    if job.master_weights and job.mixed_precision:
        before, update, after = _megatron_passes(job)
        if not per_tensor:
            return pass_ops([*before, update, *after], sizes, gpu)
        # the copies stay multi-tensor (apex's); the clipping norm (torch's clip_grad_norm_
        # before its foreach version, PyTorch 2.0) and the update run tensor by tensor
        copies = [p for p in before if p[0] != "grad_norm"]
        looped = [p for p in before if p[0] == "grad_norm"] + OPTIMIZER_PASSES[job.optimizer]
        return [*pass_ops(copies, sizes, gpu), *pass_ops(looped, sizes, gpu, per_tensor=True),
                *pass_ops(after, sizes, gpu)]
    passes = list(OPTIMIZER_PASSES[job.optimizer])
    if job.precision == "fp16":
        passes.insert(0, ("unscale_", 1, 1, False))  # GradScaler: unscale, check inf/nan
    return pass_ops(passes, sizes, gpu, 2 if job.pure_bf16 else 4, per_tensor=per_tensor)


def pass_ops(passes: list[Pass], sizes: list[int], gpu: bool,
             element_bytes: int = 4, per_tensor: bool = False, prefix: str = "") -> list[Op]:
    """The kernels of an optimizer's passes over parameter tensors of ``sizes``, whose
    weights, gradients and states have ``element_bytes`` each (fp32 unless pure bf16);
    ``per_tensor``: one kernel per tensor on a GPU too; ``prefix`` starts each kernel's
    name."""
    if gpu and not per_tensor:
        groups = math.ceil(len(sizes) / TENSORS_PER_OPTIMIZER_KERNEL)
        total = sum(sizes)
        chunks = [total / groups] * groups
    else:
        chunks = [float(s) for s in sizes]
    ops = []
    for name, reads, writes, allocates in passes:
        scalar = not reads and not writes  # a one-element op (a step count, a norm's norm)
        for i, elements in enumerate(chunks):
            if scalar:
                elements, reads, writes = 1.0, 1.0, 1.0
            ops.append(memory_op(f"{prefix}optimizer.{name}.{i}", reads * elements,
                                 writes * elements, element_bytes, allocates=allocates,
                                 layer="optimizer", phase="optimizer"))
    return ops
