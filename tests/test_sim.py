"""The simulator against theory: no overlap means the sum of costs; tiny models are host-bound."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpusim.estimation import simulate_step
from gpusim.hardware.profile import GPUProfile
from gpusim.plan.job import TrainingJob
from gpusim.plan.lower import lower
from gpusim.sim.engine import simulate
from gpusim.workload import zoo


def test_without_overlap_the_step_is_the_sum_of_its_costs(h100: GPUProfile) -> None:
    # Synthetic data and free dispatch: nothing can overlap the one compute stream, so the
    # step is exactly the sum of its kernels' times.
    job = TrainingJob(zoo.get("gpt2"), h100, 8, "bf16", loader_workers=0)
    plan = lower(job)
    free = replace(plan, microbatch=tuple(replace(k, host_s=0.0) for k in plan.microbatch),
                   optimizer=tuple(replace(k, host_s=0.0) for k in plan.optimizer))
    result = simulate(free, on_gpu=True)
    expected = sum(k.device_s for k in (*plan.microbatch, *plan.optimizer))
    assert result.step_time_s == pytest.approx(expected, rel=1e-9)
    assert result.busy_s == pytest.approx(expected, rel=1e-9)


def test_a_host_slower_than_every_kernel_sets_the_pace(h100: GPUProfile) -> None:
    # Each dispatch outlasts every kernel: the stream waits on the host, so the step is all
    # the dispatches plus the last kernel.
    plan = lower(TrainingJob(zoo.get("gpt2"), h100, 8, "bf16", loader_workers=0))
    slow = max(k.device_s for k in (*plan.microbatch, *plan.optimizer)) * 2
    host_bound = replace(plan, microbatch=tuple(replace(k, host_s=slow) for k in plan.microbatch),
                         optimizer=tuple(replace(k, host_s=slow) for k in plan.optimizer))
    result = simulate(host_bound, on_gpu=True)
    kernels = len(plan.microbatch) + len(plan.optimizer)
    assert result.step_time_s == pytest.approx(kernels * slow + plan.optimizer[-1].device_s,
                                               rel=1e-9)


def test_breakdown_sums_to_the_step(h100: GPUProfile) -> None:
    job = TrainingJob(zoo.get("resnet50"), h100, 128, "bf16", grad_accum=4)
    step = simulate_step(job)
    assert sum(step.breakdown_s.values()) == pytest.approx(step.step_time_s, rel=1e-9)


def test_a_tiny_model_is_limited_by_host_dispatch(h100: GPUProfile) -> None:
    step = simulate_step(TrainingJob(zoo.get("mnist-mlp"), h100, 64, "fp32", loader_workers=0))
    busy = sum(step.breakdown_s[k] for k in ("forward", "backward", "optimizer"))
    assert step.step_time_s > 1.1 * busy  # the GPU waits on the host
    plan = lower(TrainingJob(zoo.get("mnist-mlp"), h100, 64, "fp32", loader_workers=0))
    host_total = sum(k.host_s for k in (*plan.microbatch, *plan.optimizer))
    device_total = sum(k.device_s for k in (*plan.microbatch, *plan.optimizer))
    assert host_total > device_total
    assert host_total <= step.step_time_s <= host_total + plan.optimizer[-1].device_s + \
        sum(k.device_s for k in plan.optimizer)


def test_a_slow_loader_makes_the_step_input_bound(h100: GPUProfile) -> None:
    job = TrainingJob(zoo.get("resnet50"), h100, 256, "bf16", loader_workers=1)
    step = simulate_step(job)
    loader_s = 256 * job.model.input.loader_cpu_s
    assert step.step_time_s == pytest.approx(loader_s, rel=0.01)
    assert step.breakdown_s["input_pipeline"] > 0.5 * step.step_time_s


def test_gradient_accumulation_scales_the_step(h100: GPUProfile) -> None:
    # Large enough that the device, not the host, sets the pace of every phase.
    one = simulate_step(TrainingJob(zoo.get("gpt2"), h100, 16, "bf16", loader_workers=0))
    four = simulate_step(TrainingJob(zoo.get("gpt2"), h100, 64, "bf16", grad_accum=4,
                                     loader_workers=0))
    opt = one.breakdown_s["optimizer"]
    # Within 2%: a step's first microbatch waits for the host to issue its first layers;
    # later microbatches' host work hides behind the device's work on the one before.
    assert four.step_time_s == pytest.approx(4 * (one.step_time_s - opt) + opt, rel=0.02)


def test_simulation_is_deterministic(h100: GPUProfile) -> None:
    job = TrainingJob(zoo.get("resnet50"), h100, 64, "bf16")
    assert simulate_step(job).step_time_s == simulate_step(job).step_time_s


def test_cpu_device_runs_ops_on_the_host() -> None:
    from gpusim.hardware.catalog import catalog
    from gpusim.hardware.profile import CPUProfile

    cpus = catalog().all(CPUProfile)
    if not cpus:
        pytest.skip("no CPU profiles shipped")
    step = simulate_step(TrainingJob(zoo.get("mnist-cnn"), cpus[0], 64, "fp32"))
    assert step.breakdown_s["host_dispatch"] > 0
    assert step.breakdown_s["forward"] + step.breakdown_s["backward"] > 0


def test_mfu_of_an_fp32_cnn_is_against_the_tf32_peak_its_convolutions_use(
        h100: GPUProfile) -> None:
    job = TrainingJob(zoo.get("resnet50"), h100, 128, loader_workers=0)
    step = simulate_step(job)
    tf32, _ = h100.peak_flops("tf32", matrix=True)
    assert step.peak_flops == tf32
    assert 0 < step.mfu < 1
    mlp = simulate_step(TrainingJob(zoo.get("mnist-mlp"), h100, 128, loader_workers=0))
    assert mlp.peak_flops == h100.peak_flops("fp32", matrix=True)[0]  # no convolutions
