"""Memory plan and training techniques: OOM, mixed precision, checkpointing, frozen layers."""

from __future__ import annotations

import pytest

from gpusim.errors import InvalidConfig, OutOfMemory, UnsupportedPrecision
from gpusim.estimation import simulate_step
from gpusim.hardware.profile import GPUProfile
from gpusim.plan.job import TrainingJob
from gpusim.plan.lower import microbatch_ops
from gpusim.plan.memory import memory_plan
from gpusim.plan.recompute import checkpointed_blocks
from gpusim.workload import zoo


def test_adam_keeps_16_bytes_per_parameter(h100: GPUProfile) -> None:
    model = zoo.get("gpt2")
    plan = memory_plan(TrainingJob(model, h100, 1, "fp32"))
    states = plan.weights + plan.gradients + plan.optimizer_states
    assert states == pytest.approx(16 * model.parameters)


def test_gpt3_175b_does_not_fit_one_gpu_and_says_why(h100: GPUProfile) -> None:
    with pytest.raises(OutOfMemory, match="optimizer states") as err:
        simulate_step(TrainingJob(zoo.get("gpt3-175b"), h100, 1, "bf16"))
    assert err.value.required_bytes > err.value.available_bytes


def test_mixed_precision_halves_activations(h100: GPUProfile) -> None:
    model = zoo.get("resnet50")
    fp32 = memory_plan(TrainingJob(model, h100, 8, "fp32")).activations
    bf16 = memory_plan(TrainingJob(model, h100, 8, "bf16")).activations
    assert bf16 == pytest.approx(fp32 / 2, rel=0.02)


def test_checkpointing_trades_memory_for_recompute(h100: GPUProfile) -> None:
    model = zoo.get("gpt2-medium")
    plain = TrainingJob(model, h100, 8, "bf16", loader_workers=0)
    ckpt = TrainingJob(model, h100, 8, "bf16", checkpointing="full", loader_workers=0)
    assert memory_plan(ckpt).activations < memory_plan(plain).activations / 3
    step_plain, step_ckpt = simulate_step(plain), simulate_step(ckpt)
    recompute = step_ckpt.breakdown_s["recompute"]
    assert recompute < step_plain.breakdown_s["forward"]
    assert step_ckpt.step_time_s > step_plain.step_time_s


def test_full_checkpointing_reruns_the_body_blocks_only(h100: GPUProfile) -> None:
    """Frameworks wrap each transformer layer: embeddings, head and loss run once and keep
    what they save (the loss its fp32 log-probabilities)."""
    model = zoo.get("gpt2-medium")
    job = TrainingJob(model, h100, 8, "bf16", checkpointing="full", loader_workers=0)
    ops = microbatch_ops(job)
    rerun = {o.layer for o in ops if o.phase == "recompute"}
    body = {la.name for la in model.layers if la.block in checkpointed_blocks('full', model)}
    assert rerun == {name for name in body if any(o.layer == name for o in ops)}
    assert not rerun & {"embed.tokens", "final_norm", "head.vocab", "loss"}
    loss = model.layers[-1]
    assert memory_plan(job).activations > loss.saved_bytes(8, job.numerics())


def test_frozen_layers_skip_weight_gradients(h100: GPUProfile) -> None:
    model = zoo.get("resnet50")
    frozen = ("stem", "conv1", "bn1", "layer1", "layer2")
    full = TrainingJob(model, h100, 32, "bf16")
    part = TrainingJob(model, h100, 32, "bf16", frozen=("conv1", "bn1", "layer1", "layer2"))
    wgrads = lambda job: [o for o in microbatch_ops(job) if o.name.endswith("wgrad")]  # noqa: E731
    assert len(wgrads(part)) < len(wgrads(full))
    assert not any(o.layer.startswith(frozen[2:]) for o in wgrads(part))
    assert memory_plan(part).optimizer_states < memory_plan(full).optimizer_states


def test_the_first_layer_computes_no_input_gradient(h100: GPUProfile) -> None:
    ops = microbatch_ops(TrainingJob(zoo.get("resnet50"), h100, 32, "bf16"))
    assert not any(o.name == "conv1.dgrad" for o in ops)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"batch_size": 0}, InvalidConfig, "batch size must be positive"),
        ({"batch_size": -4}, InvalidConfig, "batch size must be positive"),
        ({"batch_size": 10, "grad_accum": 3}, InvalidConfig, "not divisible"),
        ({"precision": "fp12"}, InvalidConfig, "unknown precision"),
        ({"frozen": ("nosuchlayer",)}, InvalidConfig, "matches no layer"),
    ],
)
def test_bad_jobs_are_refused(h100: GPUProfile, kwargs: dict[str, object],
                              error: type[Exception], message: str) -> None:
    args: dict[str, object] = {"batch_size": 8, **kwargs}
    with pytest.raises(error, match=message):
        TrainingJob(zoo.get("resnet50"), h100, **args)  # type: ignore[arg-type]


def test_fp8_needs_fp8_tensor_cores() -> None:
    from gpusim.hardware.catalog import catalog
    from gpusim.hardware.profile import GPUProfile as Gpu

    without = [g for g in catalog().all(Gpu) if "fp8" not in g.matrix_tflops]
    if not without:
        pytest.skip("every shipped GPU has fp8")
    with pytest.raises(UnsupportedPrecision, match="fp8"):
        TrainingJob(zoo.get("gpt2"), without[0], 8, "fp8")


def test_a_fused_loss_keeps_the_logits_once(h100: GPUProfile) -> None:
    """Under a compiled (fused) cross-entropy the head's logits are the loss's own saved
    tensor and the loss writes their one gradient: the head's output and gradient are not
    counted again as the largest transient. An eager loss that upcasts keeps fp32
    log-probabilities instead, and the head's transient stays."""
    from gpusim.stack import apply_stack, load_stack

    model = zoo.get("gpt2")
    head = next(lay for lay in model.layers if lay.name.startswith("head"))
    fused, eager = (TrainingJob(apply_stack(model, stack), h100, 4, "bf16", stack=stack)
                    for stack in (load_stack("llm-foundry-2023"), load_stack("pytorch")))
    logits_and_grad = 2 * 4 * head.out_elements * 2
    assert memory_plan(eager).transient == logits_and_grad
    assert memory_plan(fused).transient < logits_and_grad / 4


def test_adafactor_keeps_factored_second_moments(h100: GPUProfile) -> None:
    """Hugging Face's Adafactor (no first moment) keeps a matrix's row and column means and
    a vector whole, in fp32: an MLP's states are a few kilobytes where Adam's are 8 bytes a
    parameter; each tensor's step runs a dozen passes over it."""
    from gpusim.plan.optimizer_step import optimizer_ops

    model = zoo.get("mnist-mlp")
    adam = memory_plan(TrainingJob(model, h100, 64, "fp32", optimizer="adam"))
    ada_job = TrainingJob(model, h100, 64, "fp32", optimizer="adafactor")
    ada = memory_plan(ada_job)
    expected = 0
    for layer in model.layers:
        if getattr(layer, "in_features", 0):  # a linear layer: (out, in) weight and bias
            expected += layer.in_features + 2 * layer.out_features
    assert ada.optimizer_states == 4 * expected
    assert adam.optimizer_states == 8 * model.parameters
    assert ada.optimizer_states < adam.optimizer_states / 50
    weight = max(size for lay in model.layers for size in lay.tensor_sizes())
    assert ada.optimizer_temporaries == 2 * 4 * weight
    assert len(optimizer_ops(ada_job)) > len(optimizer_ops(TrainingJob(
        model, h100, 64, "fp32", optimizer="adam")))


def test_adafactor_keeps_autocasts_weight_copies(h100: GPUProfile) -> None:
    """The optimizer changes the states, not what autocast caches: under fp16 autocast an
    Adafactor run keeps the same 16-bit weight copies from forward to backward as an Adam
    run (the plan once lost them to a name reused for Adafactor's temporaries)."""
    model = zoo.get("bert-large", seq_len=128)
    copies = [memory_plan(TrainingJob(model, h100, 4, "fp16", optimizer=opt)).weight_copies
              for opt in ("adamw", "adafactor")]
    assert copies[0] > 0.5 * 2**30
    assert copies[1] == copies[0]


def test_adafactor_is_refused_where_megatron_steps(h100: GPUProfile) -> None:
    with pytest.raises(InvalidConfig, match="no Adafactor"):
        TrainingJob(zoo.get("gpt2"), h100, 8, "bf16", optimizer="adafactor",
                    master_weights=True)


def test_the_loss_keeps_nothing_once_checkpointed_blocks_rerun(h100: GPUProfile) -> None:
    """Under full recompute the first block re-runs after the loss's and the head's backward,
    when autograd has freed what they kept (the logits): the re-run's peak holds the other
    activations only. The loss's backward, before it, holds all of them."""
    from gpusim.stack import apply_stack, load_stack

    stack = load_stack("llm-foundry-2023")  # a fused loss: its backward buffers are small
    job = TrainingJob(apply_stack(zoo.get("gpt2"), stack), h100, 8, "bf16",
                      checkpointing="full", stack=stack)
    plan = memory_plan(job)
    assert plan.tail_kept > plan.recompute_working > 0
    parts = plan._at_backward()
    at_loss = plan.activations - plan.recompute_working + plan.loss_transient
    at_rerun = plan.activations - plan.tail_kept + plan.transient
    assert parts["activations"] + parts["transient"] == max(at_loss, at_rerun)
    # the re-run no longer holds the logits the loss kept
    assert at_rerun <= plan.activations + plan.transient - plan.tail_kept
