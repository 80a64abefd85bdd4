"""Software stacks (stacks/*.yaml): how a framework writes the layers decides what they keep
for backward; each choice is checked against the bytes PyTorch's autograd really saves."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusim.errors import InvalidConfig, UnknownName
from gpusim.estimation import build_job, estimate
from gpusim.hardware.profile import GPUProfile
from gpusim.plan.job import TrainingJob
from gpusim.plan.lower import microbatch_ops
from gpusim.plan.memory import activations_by_layer, memory_plan
from gpusim.stack import CHOICES, apply_stack, load_stack, stack_names
from gpusim.validate.published_memory import load_cases
from gpusim.workload import zoo
from gpusim.workload.zoo.transformer import TransformerConfig, build_transformer

# Small Llama-style dimensions for the autograd comparison (GQA 8 heads over 2 groups).
H, HEADS, KV, FFN, SEQ, BATCH = 256, 8, 2, 704, 128, 2


def _small_llama(stack: str, attention: str | None = None):  # type: ignore[no-untyped-def]
    cfg = TransformerConfig(name="small", layers=2, hidden=H, heads=HEADS, kv_heads=KV,
                            ffn_hidden=FFN, vocab=1000, seq_len=SEQ, norm="rmsnorm",
                            activation="swiglu", positions="rotary", tied_embeddings=False,
                            bias=False)
    return apply_stack(build_transformer(cfg), load_stack(stack).with_attention(attention))


def _block_bytes_per_token(h100: GPUProfile, stack: str, attention: str | None = None
                           ) -> float:
    job = TrainingJob(_small_llama(stack, attention), h100, BATCH, "bf16", pure_bf16=True,
                      loader_workers=0)
    kept, _ = activations_by_layer(job)
    return sum(v for k, v in kept.items() if k.startswith("h.1.")) / (BATCH * SEQ)


@pytest.mark.parametrize("name", stack_names())
def test_every_stack_loads_and_cites_every_choice(name: str) -> None:
    stack = load_stack(name)
    assert set(CHOICES) <= set(stack.sources)
    assert all(len(text) > 20 for text in stack.sources.values())


def test_unknown_stacks_and_unsourced_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(UnknownName, match="hf-transformers"):
        load_stack("no-such-stack")
    bad = tmp_path / "mine.yaml"
    bad.write_text("name: mine\nfull_name: Mine\nrms_norm: upcast\nsources: {}\n")
    with pytest.raises(InvalidConfig, match="sources"):
        load_stack(str(bad))
    mine = tmp_path / "ok.yaml"
    lines = "".join(f"  {c}: my framework's code, file and function\n" for c in CHOICES)
    mine.write_text(f"name: ok\nfull_name: Mine\nrms_norm: upcast\nsources:\n{lines}")
    assert load_stack(str(mine)).rms_norm == "upcast"


def test_a_stack_changes_what_a_block_keeps(h100: GPUProfile) -> None:
    """Per token of one block, in units of the hidden size: the upcasting norms keep an fp32
    copy (4) and the 16-bit normalized tensor (2) where a fused one keeps its input (2);
    expanded K and V take 2 each instead of 0.5; an unfused SwiGLU keeps gate, silu(gate)
    and up (3 x 5.5). Transformer Engine hands its attention output to the projection as it
    is, so Megatron keeps that tensor once (2 less) where SDPA's cuDNN output is merged by a
    copy."""
    hf = _block_bytes_per_token(h100, "hf-transformers") / H
    pt = _block_bytes_per_token(h100, "pytorch") / H
    mega = _block_bytes_per_token(h100, "megatron") / H
    assert hf - pt == pytest.approx(2 * 4 + 2 * 1.5)  # norms, then K and V
    # the fused SwiGLU keeps its two inputs only; the attention output kept once
    assert pt - mega == pytest.approx(5.5 + 2)


def test_hf_block_matches_what_pytorch_autograd_saves(h100: GPUProfile) -> None:
    """The same block written as Hugging Face writes it, run in real PyTorch (CPU, bf16),
    with every tensor autograd saves counted once, under FlashAttention. gpusim's auto
    kernel keeps 2 bytes a token per hidden unit more: the attention output's merge into
    the projection's layout, a copy under the cuDNN kernel (seen in the H100 profiles) that
    FlashAttention's output layout avoids; named flash2, the two agree to the fp32
    log-sum-exp's rounding (8 bytes a token)."""
    torch = pytest.importorskip("torch")
    measured = _autograd_block_bytes(torch) / (BATCH * SEQ)
    predicted = _block_bytes_per_token(h100, "hf-transformers")
    assert predicted - measured == pytest.approx(2 * H, rel=0.02)
    flash = _block_bytes_per_token(h100, "hf-transformers", attention="flash2")
    assert abs(flash - measured) <= 8


def _autograd_block_bytes(torch):  # type: ignore[no-untyped-def]
    nn, functional = torch.nn, torch.nn.functional
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    bf16 = torch.bfloat16
    hd = H // HEADS

    def linear(i: int, o: int):  # type: ignore[no-untyped-def]
        return nn.Linear(i, o, bias=False).to(bf16)

    w_norm1 = nn.Parameter(torch.ones(H, dtype=bf16))
    w_norm2 = nn.Parameter(torch.ones(H, dtype=bf16))
    q_p, k_p, v_p, o_p = linear(H, H), linear(H, KV * hd), linear(H, KV * hd), linear(H, H)
    w1, w3, w2 = linear(H, FFN), linear(H, FFN), linear(FFN, H)
    cos, sin = torch.randn(SEQ, hd, dtype=bf16), torch.randn(SEQ, hd, dtype=bf16)

    def norm(x, w):  # type: ignore[no-untyped-def]  # upcast, normalize, cast back, weight
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * x32.to(bf16)

    def rope(x):  # type: ignore[no-untyped-def]
        a, b = x.chunk(2, -1)
        return x * cos + torch.cat((-b, a), -1) * sin

    def heads(y, n):  # type: ignore[no-untyped-def]
        return y.view(BATCH, SEQ, n, hd).transpose(1, 2)

    def block(x):  # type: ignore[no-untyped-def]
        y = norm(x, w_norm1)
        q, k, v = heads(q_p(y), HEADS), heads(k_p(y), KV), heads(v_p(y), KV)
        q, k = rope(q), rope(k)
        k = k.repeat_interleave(HEADS // KV, 1)
        v = v.repeat_interleave(HEADS // KV, 1)
        a = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + o_p(a.transpose(1, 2).reshape(BATCH, SEQ, H))
        y = norm(x, w_norm2)
        return x + w2(functional.silu(w1(y)) * w3(y))

    skip = {t.untyped_storage().data_ptr() for t in
            [w_norm1, w_norm2, cos, sin] + [m.weight for m in (q_p, k_p, v_p, o_p, w1, w3, w2)]}
    seen: dict[int, int] = {}

    def pack(t):  # type: ignore[no-untyped-def]
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    x = torch.randn(BATCH, SEQ, H, dtype=bf16, requires_grad=True)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    return float(sum(seen.values()))


def test_expanded_kv_copies_k_and_v_out_and_back(h100: GPUProfile) -> None:
    job = TrainingJob(_small_llama("hf-transformers"), h100, 2, "bf16", loader_workers=0)
    names = {op.name.rsplit(".", 1)[-1] for op in microbatch_ops(job)}
    assert {"repeat_kv", "repeat_kv_grad"} <= names
    native = TrainingJob(_small_llama("pytorch"), h100, 2, "bf16", loader_workers=0)
    assert "repeat_kv" not in {op.name.rsplit(".", 1)[-1] for op in microbatch_ops(native)}


def test_the_loss_follows_the_stack(h100: GPUProfile) -> None:
    """LitGPT's cross-entropy on bf16 logits keeps half what an fp32 loss keeps, and
    torchtune's 8 chunks hold an eighth of the loss's gradients at once."""
    def plan(stack: str):  # type: ignore[no-untyped-def]
        model = apply_stack(zoo.get("llama3-8b", seq_len=1024), load_stack(stack))
        return model.layers[-1], TrainingJob(model, h100, 2, "bf16", pure_bf16=True)

    lit, job = plan("litgpt")
    ref, _ = plan("pytorch")
    tune, _ = plan("torchtune")
    num = job.numerics()
    assert lit.saved_bytes(2, num) == pytest.approx(ref.saved_bytes(2, num) / 2)
    assert tune.transient_bytes(2, num) == pytest.approx(ref.transient_bytes(2, num) / 8)


def test_gradients_kept_between_steps_count_at_the_backward_pass(h100: GPUProfile) -> None:
    model = zoo.get("gpt2")
    freed = memory_plan(TrainingJob(model, h100, 4, "bf16", stack=load_stack("pytorch")))
    kept = memory_plan(TrainingJob(model, h100, 4, "bf16",
                                   stack=load_stack("hf-transformers-2022")))
    assert freed.peak_phase == kept.peak_phase == "backward"
    assert kept.peak_bytes - freed.peak_bytes == pytest.approx(freed.gradients)


def test_the_optimizer_step_can_be_the_peak(h100: GPUProfile) -> None:
    """The project's H100 run of four Llama-3-8B blocks peaked at 35.88 GiB at microbatch
    1 and 2 alike (measurements/h100-sxm/models.json): the foreach Adam step (weights,
    gradients, states and one sqrt temporary), not the backward pass."""
    spec = TransformerConfig(name="llama-blocks", layers=4, hidden=4096, heads=32, kv_heads=8,
                             ffn_hidden=14336, vocab=128256, seq_len=2048, norm="rmsnorm",
                             activation="swiglu", positions="rotary", tied_embeddings=False,
                             bias=False)
    peaks = []
    for batch in (1, 2):
        plan = memory_plan(TrainingJob(build_transformer(spec), h100, batch, "bf16",
                                       loader_workers=0))
        assert plan.peak_phase == "optimizer"
        peaks.append(plan.peak_bytes / 2**30)
    assert peaks[0] == peaks[1] == pytest.approx(35.88, rel=0.02)


def test_ddp_keeps_a_bucket_copy_of_the_gradients_megatron_does_not() -> None:
    def mem(**kw: object):  # type: ignore[no-untyped-def]
        from gpusim.plan.memory_report import memory_report

        job, _ = build_job("gpt2", "h100-sxm", 16, precision="bf16", num_gpus=8,
                           system="dgx-h100", **kw)  # type: ignore[arg-type]
        return memory_report(job).plan

    ddp = mem()
    assert ddp.communication_buffers == pytest.approx(ddp.gradients)
    assert mem(zero=3).communication_buffers == 0


def test_the_stack_is_named_in_the_assumptions() -> None:
    est = estimate("llama3-8b", "h100-sxm", 1, precision="bf16", seq_len=1024,
                   pure_bf16=True, stack="torchtune")
    assert est.assumptions[0].startswith("torchtune stack")


# Published measured peaks (published/peak_memory.yaml; benchmarks/memory.py prints them).
# As of this commit: 26 of 71 cases expressible (8 of them LoRA), mean error 3.9%, largest
# 11.8% (torchtitan Llama 3.1 8B FSDP on 8 H100s, a reserved figure: the allocator's reserve
# is a median of our own runs, and 8 GiB fp32 logits may fragment more); the target
# is 10% on every case, which that case misses. One run that trained is predicted to need
# 0.01 GiB more than the 95% of the card gpusim lets a job use (GPT-2 XL under DDP on 40 GB
# A100s: predicted within 1% of its measured peak); the target is that none is
# refused, which it misses too (met 2026-11-24: a job fits against the driver's total less
# what the allocator strands, from published OOM messages). Five LitGPT figures are
# excluded in the data file, with the reason: they match loading the checkpoint, not
# training.
# With torch.compile modelled (2026-11-23): 32 cases, mean 4.4%. Two torchtune runs that
# chunk the loss under torch.compile were predicted 8% and 20% high, about 5 GB each. Once
# a fused (compiled) loss's logits were no longer counted a second time as the head's
# output and gradient, the first lands within 1%; the second peaked in the optimizer step,
# where gpusim counted foreach Adam's sqrt(v) temporary (6 GB) that the run does not show.
# 2026-11-25: torchtune's rows step torch's AdamW fused, as its AdamW configs set it
# (fused: True): -3.8%, inside the common budget.
# FP8 and context-parallel runs, mapped once both were modelled (2026-11-23): 12 cases (six
# more combine FSDP with pipeline stages, which gpusim refuses), mean 11.3%. The largest
# misses are torchtitan's Llama 3.1 70B at FSDP 32 x TP 8 with full recompute, 23-27% low,
# and Llama 3.1 8B at 32K-256K tokens (CP 1-8), 10% low; unexplained. Held apart so the
# budget of the 32 above stays as tight as it was. 2026-11-24: the six 405B runs (FSDP 8 x
# TP 8 x PP 8) pipelined as torchtitan does (its default microbatch count and stage split):
# 18 cases, mean 8.3%, largest 19.2% (405B at 256K tokens over CP 8).
PUBLISHED_MEAN_ERROR = 0.05
PUBLISHED_MAX_ERROR = 0.12
FP8_OR_CP_MEAN_ERROR = 0.09
FP8_OR_CP_MAX_ERROR = 0.20
# The same torchtune recipe with its memory savers, mapped once they were modelled
# (optimizer step in backward, activation offloading; issue 14). Once the loss's and head's
# kept tensors were freed before the first checkpointed block is re-run, as autograd frees
# them: LoRA +4.5%, QLoRA +8.4%, the full fine-tunes -3%, and with an 8-bit AdamW whose
# implementation the source does not name (bitsandbytes or torchao) -14% (2.4 GiB low).
# Held to their own budget, by name.
TORCHTUNE_MEMORY_SAVERS = {
    "torchtune_llama32_3b_full_1gpu_packed_compile_chunkedce_ac_optinbwd",
    "torchtune_llama32_3b_full_1gpu_packed_compile_chunkedce_ac_optinbwd_actoffload",
    "torchtune_llama32_3b_full_1gpu_packed_compile_chunkedce_ac_optinbwd_actoffload_adamw8bit",
    "torchtune_llama32_3b_lora_1gpu_packed_compile_chunkedce_ac_actoffload",
    "torchtune_llama32_3b_qlora_1gpu_packed_compile_chunkedce_ac_actoffload"}
TORCHTUNE_MEMORY_SAVERS_MAX_ERROR = 0.15
# Adafactor (issue 14): with fp32 BERT-large at batch 4 the nvidia-smi figure is met within
# 7%, as Adam's is; under fp16 autocast with gradient accumulation and checkpointing it was
# 1.0 GiB low (-22%) until 2026-11-25, when the memory plan stopped dropping autocast's
# weight copies under Adafactor (a name reused for its temporaries' count): -9%, inside the
# common budget.
# LitGPT's phi-1.5 LoRA (parallel attention and MLP on one norm), modelled since the block
# was built: 2.1 GiB low (-21%), where its Llama 2 LoRA rows of the same table are within
# 6%; what lit-gpt's Phi keeps beyond that is not found yet (issue 14)
PHI_LORA = {"litgpt_rt_phi15_lora_1gpu_mb4"}
PHI_LORA_MAX_ERROR = 0.22
# torchao's CPUOffloadOptimizer on a ViT-g (states and step on the host, as --offload
# optimizer): 0.6 GiB low (-13%), the same run without offload 7% low
CPU_OFFLOAD = {"torchao_optim_vit_g14_dinov2_1gpu_bf16_ac_ao_cpu_offload_optimizer"}
CPU_OFFLOAD_MAX_ERROR = 0.14


def _fp8_or_cp(job: object) -> bool:
    parallel = getattr(job, "parallel", None)
    return getattr(job, "precision", "") == "fp8" or getattr(parallel, "context", 1) > 1


def test_published_peak_memories_within_budget_and_never_refused() -> None:
    everything = [c for c in load_cases() if c.job is not None]
    late = {c.id: abs(c.predicted_gib() / c.measured_gib - 1) for c in everything
            if _fp8_or_cp(c.job)}
    assert len(late) >= 12
    assert sum(late.values()) / len(late) <= FP8_OR_CP_MEAN_ERROR
    assert max(late.values()) <= FP8_OR_CP_MAX_ERROR
    savers = [c for c in everything if c.id in TORCHTUNE_MEMORY_SAVERS]
    assert len(savers) == len(TORCHTUNE_MEMORY_SAVERS)
    for case in savers:
        assert abs(case.predicted_gib() / case.measured_gib - 1) \
            <= TORCHTUNE_MEMORY_SAVERS_MAX_ERROR
    cases = [c for c in everything if c.id not in late and c.id not in TORCHTUNE_MEMORY_SAVERS
             and c.id not in PHI_LORA]
    phi = [c for c in everything if c.id in PHI_LORA]
    assert len(phi) == len(PHI_LORA)
    for case in phi:  # held to its own bound, apart from the mean of the rows above
        assert abs(case.predicted_gib() / case.measured_gib - 1) <= PHI_LORA_MAX_ERROR
    assert len(cases) >= 32
    errors = {c.id: abs(c.predicted_gib() / c.measured_gib - 1) for c in cases}
    assert sum(errors.values()) / len(errors) <= PUBLISHED_MEAN_ERROR
    assert max(e for i, e in errors.items()
               if i not in CPU_OFFLOAD) <= PUBLISHED_MAX_ERROR
    assert max(errors[i] for i in CPU_OFFLOAD) <= CPU_OFFLOAD_MAX_ERROR
    # each trained, so none may be refused (but the one named above, by a hair)
    # every run that trained fits (since 2026-11-24, when a job fits against what the
    # driver gives a process less what the allocator strands, not 95% of the card)
    assert not [c.id for c in everything if not c.fits()]


def test_megatron_formulas_agree_where_the_same_things_are_counted() -> None:
    """Against Megatron-LM's theoretical_memory_usage on its dev cases (selective recompute,
    sequence parallel): activations agree; weights and optimizer states differ by the fp16
    gradients these runs keep (16 bytes a parameter, where the formula says 18) and by the
    learned position table, replicated on every tensor-parallel rank, which the formula
    leaves out (2.5% of the first stage at PP 64, where a stage holds two layers)."""
    from gpusim.validate.megatron import CASES
    from gpusim.validate.megatron_memory import compare

    for case in CASES:
        r = compare(case)
        assert r.gpusim_activations == pytest.approx(r.megatron_activations, rel=0.01)
        assert r.gpusim_states * 18 / 16 == pytest.approx(r.megatron_states, rel=0.03)
        assert r.gpusim_other > 0


def test_a_fused_loss_keeps_the_16_bit_logits_and_writes_one_gradient() -> None:
    """flash-attn's fused cross-entropy (llm-foundry's default loss) keeps the logits as they
    come with an fp32 log-sum-exp a row, and writes one gradient in their type, where
    PyTorch's loss under autocast keeps fp32 log-probabilities and holds two fp32 gradients
    at once; one pass over the logits each way instead of five."""
    from gpusim.workload.attention import CrossEntropy
    from gpusim.workload.numerics import Numerics

    rows, vocab = 4096, 50368
    num = Numerics("bf16", "bf16", "bf16")
    plain = CrossEntropy("loss", vocab, rows)
    model = build_transformer(TransformerConfig(name="t", layers=1, hidden=64, heads=2,
                                                vocab=vocab, seq_len=rows))
    fused = next(la for la in apply_stack(model, load_stack("llm-foundry-2023")).layers
                 if isinstance(la, CrossEntropy))
    assert fused.fused
    logits = rows * vocab
    assert fused.saved_bytes(1, num) == logits * 2 + rows * 4
    assert plain.saved_bytes(1, num) == logits * 4
    assert fused.transient_bytes(1, num) == logits * 2 == plain.transient_bytes(1, num) / 4
    moved = sum(op.bytes for op in fused.forward(1, num) + fused.backward_input(1, num))
    assert moved == pytest.approx(3 * logits * 2, rel=0.01)


def test_a_per_tensor_optimizer_launches_a_kernel_per_tensor_and_pass() -> None:
    """A stack whose optimizer loops over the tensors (Hugging Face's adamw_hf, NVIDIA's
    JITLamb) runs each pass as one kernel per tensor on a GPU, where torch.optim's foreach
    kernels take about a hundred tensors each; under apex O2's master weights the copies
    stay multi-tensor and the clipping norm and the update run tensor by tensor."""
    from dataclasses import replace

    from gpusim.plan.optimizer_step import OPTIMIZER_PASSES, optimizer_ops, parameter_tensors

    looped = load_stack("pytorch").model_copy(update={"optimizer": "per_tensor"})
    job, _ = build_job("gpt2", "a100-80gb", 8, precision="fp16")
    assert isinstance(job, TrainingJob)
    tensors = len(parameter_tensors(job.model.layers, job.is_trainable))
    passes = len(OPTIMIZER_PASSES["adam"]) + 1  # and GradScaler's unscale
    foreach = optimizer_ops(job)
    per_tensor = optimizer_ops(replace(job, stack=looped))
    assert len(foreach) == passes * -(-tensors // 100)
    assert len(per_tensor) == passes * tensors
    assert sum(op.bytes for op in per_tensor) == pytest.approx(sum(op.bytes for op in foreach))
    masters = replace(job, stack=looped, master_weights=True)
    names = [op.name.split(".")[1] for op in optimizer_ops(masters)]
    update = len(OPTIMIZER_PASSES["adam"]) + 1  # and the clipping norm
    assert names.count("copy_main_params") < tensors
    assert len(names) == update * tensors + 3 * -(-tensors // 100)
    slower = estimate("gpt2", "a100-80gb", 8, precision="fp16", stack=looped)
    assert slower.step.breakdown_s["optimizer"] > estimate(
        "gpt2", "a100-80gb", 8, precision="fp16").step.breakdown_s["optimizer"]


def test_a_model_held_in_bf16_keeps_no_master_copy_under_pipeline_parallelism() -> None:
    """--pure-bf16 under pipeline (or tensor) parallelism is torch's pipelining of a bf16
    model (torchtitan, NeMo AutoModel), not Megatron-LM's fp32 master weights; a stack that
    holds its weights in bf16 (NeMo AutoModel's) implies it."""
    from gpusim.estimation import build_job

    for options in ({"pure_bf16": True}, {"stack": "nemo-automodel"}):
        job, _ = build_job("llama3-8b", "h100-sxm", 16, precision="bf16", seq_len=2048,
                           num_gpus=8, pp=2, microbatch_size=1, **options)
        assert not job.master_weights and job.pure_bf16


def test_torchtitan_pipelines_a_local_batch_as_its_defaults_say() -> None:
    """torchtitan @9dec370 (pipelining_utils.py) splits the local batch into as many
    microbatches as pipeline stages and, given no split points, deals 126 blocks over 8
    stages as 15, 16 x 6, 15 (two stages a rank under Interleaved 1F1B: 7, 8 x 14, 7)."""
    from gpusim.validate.torchtitan import torchtitan_pipeline

    assert torchtitan_pipeline({"pp_schedule": "1F1B"}, 8, 32, 126) == (
        32, 4, "1f1b", 1, (15, 16, 16, 16, 16, 16, 16, 15))
    local, micro, schedule, stages, split = torchtitan_pipeline(
        {"pp_schedule": "Interleaved 1F1B", "pp_microbatches": 4}, 8, 32, 126)
    assert (local, micro, schedule, stages) == (32, 8, "interleaved", 2)
    assert split == (7, *[8] * 14, 7)
    modelled = [c for c in load_cases() if "405b" in c.id and c.job is not None]
    assert len(modelled) == 6


def test_a_bf16_stack_says_why_it_needs_bf16() -> None:
    from gpusim.errors import InvalidConfig
    from gpusim.estimation import build_job

    with pytest.raises(InvalidConfig, match="nemo-automodel stack holds the model in bf16"):
        build_job("llama3-8b", "h100-sxm", 8, precision="fp8", seq_len=2048,
                  stack="nemo-automodel")


def test_mid_2025_torchtitan_pages_run_on_their_own_stack() -> None:
    """torchtitan's June 2025 pages (async TP, H200) and torchao's August 2025 runs ran
    nn.RMSNorm and a compiled loss with K/V still repeated: neither the 2024 stack (upcast
    norms, eager loss) nor today's (grouped K/V, gradients kept)."""
    from gpusim.validate import published_throughput as pt

    mid = load_stack("torchtitan-2025")
    assert (mid.rms_norm, mid.kv_heads, mid.compile_loss, mid.zero_grad) == \
        ("fused", "expanded", True, "to_none")
    rows = {c["id"]: c for c in pt.load_cases()}
    assert pt.job_of(rows["torchtitan_llama31_8b_h200x32_fsdp32_compile_float8"])[0][
        "stack"] == "torchtitan-2025"
    assert pt.job_of(rows["torchtitan_llama31_8b_h100x8_fsdp_sac_compile"])[0][
        "stack"] == "torchtitan-2024"
    cases = {c.id: c for c in load_cases()}
    for case in ("torchao_float8_llama3_8b_b200_fsdp8_sac_compile_bf16",
                 "torchao_float8_llama3_8b_mi300x_fsdp8_sac_compile_bf16"):
        assert cases[case].job is not None, cases[case].skipped  # B200 and MI300X modelled
        assert cases[case].job.stack.name == "torchtitan-2025"


def test_bert_adam_clips_each_tensor_and_decays_the_matrices() -> None:
    """DeepLearningExamples' BertAdam loops over the parameters: per tensor, the gradient
    clipped by its own norm (seven kernels, five of them one element), the moments and the
    update in twelve more, and two for weight decay on the matrices only (run_squad.py's
    no_decay names the biases and LayerNorm weights)."""
    from dataclasses import replace

    from gpusim.plan.optimizer_step import optimizer_ops

    job, _ = build_job("bert-large", "a100-80gb", 8, precision="tf32", seq_len=128)
    assert isinstance(job, TrainingJob)
    matrices = vectors = 0
    for lay in job.model.layers:
        for size, factored in zip(lay.tensor_sizes(), lay.factored_sizes(), strict=True):
            matrices += factored < size
            vectors += factored == size
    assert matrices >= 24 * 4 and vectors >= 24 * 8  # each block's weights; biases, norms
    bert_adam = load_stack("pytorch").model_copy(update={"optimizer": "bert_adam"})
    ops = optimizer_ops(replace(job, stack=bert_adam))
    assert len(ops) == 19 * matrices + 17 * vectors
    assert sum(op.bytes == 2 * 4 for op in ops) == 5 * (matrices + vectors)  # one element
    clipped = [op for op in ops if ".clip_mul_." in op.name]
    total = sum(size for lay in job.model.layers for size in lay.tensor_sizes())
    assert sum(op.bytes for op in clipped) == pytest.approx(8 * total)  # read, write fp32
    slower = estimate("bert-large", "a100-80gb", 8, precision="tf32", seq_len=128,
                      stack=bert_adam)
    assert slower.step.breakdown_s["optimizer"] > estimate(
        "bert-large", "a100-80gb", 8, precision="tf32", seq_len=128,
        stack=load_stack("pytorch").model_copy(update={"optimizer": "per_tensor"})
    ).step.breakdown_s["optimizer"]


def test_a_sync_before_the_step_needs_its_source() -> None:
    from gpusim.stack import Stack

    base = load_stack("pytorch").model_dump()
    with pytest.raises(ValueError, match="sync_before_step"):
        Stack.model_validate({**base, "sync_before_step": True})
    synced = Stack.model_validate({**base, "sync_before_step": True, "sources": {
        **base["sources"], "sync_before_step": "a training script's clip_grad_norm_().item()"}})
    assert "waiting for a gradient norm" in synced.describe()


def test_the_host_waits_before_the_step_where_a_value_is_read() -> None:
    """PyTorch's GradScaler reads its inf check before optimizer.step() under fp16 autocast;
    Megatron-LM reads the gradient norm (and, in fp16, its inf check); bf16 autocast with
    torch.optim reads nothing."""
    from gpusim.plan.lower import lower

    def syncs(**options: object) -> bool:
        job, _ = build_job("gpt2", "a100-80gb", 8, **options)
        assert isinstance(job, TrainingJob)
        return lower(job).sync_before_optimizer

    assert syncs(precision="fp16")
    assert not syncs(precision="bf16")
    assert syncs(precision="bf16", stack="megatron")
    job, _ = build_job("gpt2", "xeon6-2vcpu", 8, precision="fp32", stack="megatron")
    assert isinstance(job, TrainingJob)
    assert not lower(job).sync_before_optimizer  # a CPU has no queue to drain


def test_megatron_pads_the_vocabulary_to_128_per_tensor_parallel_rank() -> None:
    # Megatron-LM's vocab_size_with_padding: GPT-2's 50,257 tokens become 50,688 under TP 4
    # (a multiple of 128 x 4), so each rank's logits product is 12,672 wide, aligned; a
    # PyTorch stack splits the tokenizer's vocabulary as it is
    from gpusim.plan.parallel import plan_parallel

    def head_width(stack: str) -> int:
        job = build_job("gpt3-1.3b", None, 16, precision="bf16", system="dgx-h100",
                        num_gpus=8, tp=4, microbatch_size=1, stack=stack)[0]
        chunk = plan_parallel(job).stages[0].chunks[-1]  # type: ignore[arg-type]
        return next(la.out_features for la in chunk.layers if la.name == "head.vocab")

    assert load_stack("megatron").vocab_multiple == 128
    assert head_width("megatron") == 50688 // 4
    assert head_width("pytorch") == -(-50257 // 4)


def test_a_fused_swiglu_runs_the_generated_kernel() -> None:
    # Megatron-LM's fused SwiGLU is written under jit_fuser, torch.compile since torch 2.2:
    # its kernels are costed as TorchInductor's silu*mul, an eager stack's as PyTorch's
    from gpusim.workload.layers import Elementwise
    from gpusim.workload.numerics import Numerics

    def family(stack: str) -> str:
        model = apply_stack(zoo.get("llama3-8b", seq_len=128), load_stack(stack))
        act = next(la for la in model.layers
                   if isinstance(la, Elementwise) and la.op == "swiglu")
        return act.family(Numerics("bf16", "bf16", "bf16"))

    assert family("megatron") == "swiglu_compiled"
    assert family("pytorch") == "swiglu"
