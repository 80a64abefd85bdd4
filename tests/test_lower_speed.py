"""Lowering's per-call cost memo (issue 21): each distinct kernel is costed once per lower()
call, keyed on every field kernel_cost reads. These check that a memoised cost is the cost
kernel_cost gives that very op, and that nothing carries over from one job to the next."""

from __future__ import annotations

from typing import Any

import pytest

from gpusim.cost.energy import active_seconds
from gpusim.cost.kernels import kernel_cost
from gpusim.estimation import build_job
from gpusim.hardware.calibration import calibration_for
from gpusim.plan.autocast import layer_precisions
from gpusim.plan.job import TrainingJob
from gpusim.plan.lower import lower, microbatch_ops
from gpusim.plan.memory import activations_by_layer
from gpusim.plan.optimizer_step import optimizer_ops

JOBS: dict[str, tuple[str, str, int, dict[str, Any]]] = {
    "resnet50-bf16": ("resnet50", "a100-80gb", 8, {"precision": "bf16"}),
    "gpt2-fp8-compiled": ("gpt2", "h100-sxm", 2,
                          {"precision": "fp8", "compile": True, "checkpointing": "selective"}),
    "gpt2-in-backward": ("gpt2", "h100-sxm", 2,
                         {"precision": "bf16", "optimizer_in_backward": True,
                          "optimizer": "adamw"}),
    "mnist-cpu": ("mnist-mlp", "xeon6-2vcpu", 16, {"precision": "fp32"}),
}


def _job(name: str) -> TrainingJob:
    model, gpu, batch, options = JOBS[name]
    job = build_job(model, gpu, batch, **options)[0]
    assert isinstance(job, TrainingJob)
    return job


@pytest.mark.parametrize("name", sorted(JOBS))
def test_memoised_costs_are_each_ops_own(name: str) -> None:
    job = _job(name)
    cal = calibration_for(job.device).sustained()  # a step's products at their sustained rate
    plan = lower(job)
    ops = microbatch_ops(job)
    assert [k.name for k in plan.microbatch] == [op.name for op in ops]
    opt = [] if job.optimizer_in_backward else optimizer_ops(job)
    for kernel, op in [*zip(plan.microbatch, ops, strict=True),
                       *zip(plan.optimizer, opt, strict=True)]:
        cost = kernel_cost(op, job.device, cal)
        assert (kernel.device_s, kernel.bound, kernel.active_s) == (
            cost.seconds, cost.bound, active_seconds(cost)), op.name


def test_no_state_carries_between_jobs() -> None:
    alone = {name: lower(_job(name)) for name in JOBS}
    for name in [*JOBS, *reversed(JOBS)]:
        assert lower(_job(name)) == alone[name], name


def test_activations_with_given_precisions() -> None:
    for name in JOBS:
        job = _job(name)
        assert activations_by_layer(job, layer_precisions(job)) == activations_by_layer(job)
