"""The one-device engine steps SimPy once per microbatch pass (issue 21), with the same
results, bit for bit, as one process step per kernel (``_simulate_events``)."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
import simpy

from gpusim.estimation import build_job
from gpusim.plan.job import TrainingJob
from gpusim.plan.lower import StepPlan, lower
from gpusim.sim import engine
from gpusim.sim.engine import SimResult, simulate

# model, device, batch, options: the step, its breakdown and the trace's length, as one
# process step per kernel computed them before issue 21 (the H100 rows re-recorded when the
# hopper fit gained long_k_slope: host-bound steps, their totals unchanged; and again when
# it took small products' device figures from CUDA-graph replays alone, and on 2026-11-24
# when it gained the exposed share of a product's result write, epilogue_exposed, and when
# it pooled a fifth H100 micro run: host figures, layout and compiled-kernel factors, and
# the rate its products sustain over a step, sustained_factor; on 2026-11-24 again when it
# fitted fp32 attention apart, which moved the host's fitted cost of an attention layer's
# backward: gpt2's host dispatch)
PINNED: list[tuple[str, str, int, dict[str, Any], float, dict[str, float], int]] = [
    ("resnet50", "a100-80gb", 256, {"precision": "bf16"}, 0.10749687770447398,
     {"forward": 0.042509230286512954, "backward": 0.06238118359868144, "recompute": 0.0,
      "optimizer": 0.0011080250832959059, "input_pipeline": 0.0014880614359836786,
      "host_dispatch": 1.037730000000292e-05, "gpu_idle": 0.0}, 2555),
    ("resnet50", "h100-sxm", 2, {"precision": "bf16"}, 0.029239133390841568,  # host-bound
     {"forward": 0.0009649378991721797, "backward": 0.0013398941908454476, "recompute": 0.0,
      "optimizer": 0.0006503472830321627, "input_pipeline": 0.0,
      "host_dispatch": 0.026283954017791777, "gpu_idle": 0.0}, 2555),
    ("gpt2", "h100-sxm", 8,
     {"precision": "bf16", "seq_len": 1024, "grad_accum": 4, "loader_workers": 4},
     0.12258940931368306,
     {"forward": 0.01526388221630718, "backward": 0.030076745426569646, "recompute": 0.0,
      "optimizer": 0.003081635869147718, "input_pipeline": 0.0,
      "host_dispatch": 0.07416714580165852, "gpu_idle": 0.0}, 4371),
    ("mnist-mlp", "xeon6-2vcpu", 64, {"precision": "fp32"}, 0.0021805339601938655,  # a CPU
     {"forward": 0.0003329626009560567, "backward": 0.00048326517873158474,
      "recompute": 0.0, "optimizer": 0.0011813279205062238, "input_pipeline": 0.0,
      "host_dispatch": 0.00018297825999999992, "gpu_idle": 0.0}, 259),
]


def _plan(model: str, device: str, batch: int, options: dict[str, Any]
          ) -> tuple[StepPlan, bool]:
    job, _ = build_job(model, device, batch, **options)
    assert isinstance(job, TrainingJob)
    return lower(job), job.device.is_gpu


def _same(a: SimResult, b: SimResult) -> None:
    assert a.step_time_s == b.step_time_s
    assert list(a.breakdown_s.items()) == list(b.breakdown_s.items())
    assert a.busy_s == b.busy_s
    assert a.kernels_per_step == b.kernels_per_step
    assert a.extrapolated_microbatches == b.extrapolated_microbatches
    assert a.trace.events == b.trace.events


@pytest.mark.parametrize(("model", "device", "batch", "options", "step", "breakdown",
                          "records"), PINNED, ids=[f"{p[0]}-{p[1]}-{p[2]}" for p in PINNED])
def test_pinned_steps(model: str, device: str, batch: int, options: dict[str, Any],
                      step: float, breakdown: dict[str, float], records: int) -> None:
    plan, on_gpu = _plan(model, device, batch, options)
    assert engine._schedule(plan, on_gpu) is not None  # no fall back to a step per kernel
    result = simulate(plan, on_gpu=on_gpu)
    assert result.step_time_s == step
    assert list(result.breakdown_s.items()) == list(breakdown.items())
    assert len(result.trace.events) == records
    _same(result, engine._simulate_events(plan, on_gpu=on_gpu))


def _count_events(monkeypatch: pytest.MonkeyPatch, run: Any) -> int:
    count = [0]
    schedule = simpy.Environment.schedule

    def counting(self: simpy.Environment, *args: Any, **kwargs: Any) -> None:
        count[0] += 1
        schedule(self, *args, **kwargs)

    monkeypatch.setattr(simpy.Environment, "schedule", counting)
    run()
    monkeypatch.setattr(simpy.Environment, "schedule", schedule)
    return count[0]


def test_simpy_steps_once_per_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    # ResNet-50 on an A100, 8 loader workers: two steps of one microbatch of 621 kernels and
    # 16 optimizer kernels each. One process step per kernel scheduled 5,122 SimPy events.
    plan, on_gpu = _plan("resnet50", "a100-80gb", 256, {"precision": "bf16"})
    assert _count_events(monkeypatch, lambda: simulate(plan, on_gpu=on_gpu)) == 15
    assert _count_events(monkeypatch,
                         lambda: engine._simulate_events(plan, on_gpu=on_gpu)) == 5122


def test_same_as_a_step_per_kernel_where_records_tie() -> None:
    # Durations on a coarse grid, zeros included, so host, device, copies and loader often
    # record at one instant: where the event queue orders them, the engine falls back to it.
    base, _ = _plan("mnist-mlp", "h100-sxm", 64, {"precision": "fp32"})
    kernel = base.microbatch[0]
    rng = random.Random(21)
    fast = 0
    for _ in range(300):
        grid = rng.choice([0.25, 0.1, 1e-6])

        def kernels(phases: list[str], grid: float = grid) -> tuple[Any, ...]:
            return tuple(replace(kernel, name=f"k{rng.randint(0, 9)}", phase=phase,
                                 device_s=rng.randint(0, 4) * grid,
                                 host_s=rng.randint(0, 4) * grid) for phase in phases)

        plan = replace(
            base,
            microbatch=kernels([rng.choice(["forward", "backward"])
                                for _ in range(rng.randint(1, 6))]),
            optimizer=kernels(["optimizer"] * rng.randint(0, 3)),
            accum=rng.choice([1, 2, 4]), input_copy_s=rng.randint(0, 4) * grid,
            loader_s_per_microbatch=rng.randint(1, 32) * grid,
            loader_workers=rng.choice([0, 1, 2, 4]),
            sync_before_optimizer=rng.random() < 0.3)
        for on_gpu in (True, False):
            fast += engine._schedule(plan, on_gpu) is not None
            _same(simulate(plan, on_gpu=on_gpu), engine._simulate_events(plan, on_gpu=on_gpu))
    assert fast > 100  # most still take the fast path


def test_a_sync_before_the_optimizer_drains_the_queue() -> None:
    # A backward pass far longer than its dispatch, and an optimizer step whose dispatch is
    # slower than its kernels: without a sync the host dispatches the step while the device
    # still runs the backward pass; after a sync (a gradient norm's .item()) the step's
    # dispatch follows the backward pass and sets the step's pace.
    base, _ = _plan("mnist-mlp", "h100-sxm", 64, {"precision": "fp32"})
    kernel = base.microbatch[0]
    micro = tuple(replace(kernel, name=f"b{i}", phase="backward", device_s=1.0, host_s=0.01)
                  for i in range(4))
    opt = tuple(replace(kernel, name=f"o{i}", phase="optimizer", device_s=0.01, host_s=0.1)
                for i in range(10))
    plan = replace(base, microbatch=micro, optimizer=opt, accum=1, input_copy_s=0.0,
                   loader_workers=0)
    overlapped = simulate(plan, on_gpu=True)
    synced_plan = replace(plan, sync_before_optimizer=True)
    synced = simulate(synced_plan, on_gpu=True)
    assert overlapped.step_time_s == pytest.approx(4.0 + 0.01 * 10 + 0.01)
    assert synced.step_time_s == pytest.approx(0.01 + 4.0 + 10 * 0.1 + 0.01)
    assert synced.breakdown_s["host_dispatch"] == pytest.approx(0.01 + 10 * 0.1 - 9 * 0.01)
    syncs = [e for e in synced.trace.events if e.name == "synchronize"]
    assert len(syncs) == 2 * 2  # before each simulated step's optimizer, and at its end
    _same(synced, engine._simulate_events(synced_plan, on_gpu=True))
