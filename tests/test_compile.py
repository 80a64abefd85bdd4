"""torch.compile as a run's setting: TorchInductor fuses a block's memory-bound ops, the
host launches a compiled block's kernels without per-op Python, and what stays outside
the blocks (head, loss) runs as in eager."""

from __future__ import annotations

from typing import Any

from gpusim.estimation import build_job, estimate
from gpusim.plan.lower import lower

JOB: dict[str, Any] = {"model": "llama-3.2-1b", "gpu": "h100-sxm", "batch_size": 1,
                       "seq_len": 2048, "precision": "bf16", "stack": "torchtitan-2024",
                       "optimizer": "adamw"}


def _plan(**extra: Any) -> tuple[Any, Any]:
    job = build_job(**{**JOB, **extra})[0]
    return job, lower(job)


def test_a_compiled_step_is_faster_and_its_blocks_lose_their_casts() -> None:
    _, eager = _plan()
    job, compiled = _plan(compile=True)
    assert sum(k.device_s for k in compiled.microbatch) < sum(k.device_s
                                                              for k in eager.microbatch)
    blocks = {la.name for la in job.model.layers if la.in_body}
    names = [k.name for k in compiled.microbatch if k.layer in blocks]
    assert not [n for n in names if n.endswith((".cast_input", ".cast_input_grad"))]
    # the loss and the head stay eager: the same kernels at the same cost
    outside = {k.name: (k.device_s, k.host_s) for k in eager.microbatch
               if k.layer not in blocks}
    assert any(name.startswith("loss.") for name in outside)  # the head and loss are there
    assert {k.name: (k.device_s, k.host_s) for k in compiled.microbatch
            if k.layer not in blocks} == outside


def test_fp8_activation_scales_fold_into_their_producers_under_compile() -> None:
    _, eager = _plan(precision="fp8")
    _, compiled = _plan(precision="fp8", compile=True)
    amax = [k.name for k in eager.microbatch if k.name.endswith((".x.amax", ".dy.amax"))]
    assert amax
    assert not [k.name for k in compiled.microbatch
                if k.name.endswith((".x.amax", ".dy.amax"))]
    # a weight's amax (a graph input) stays a kernel of its own
    assert [k.name for k in compiled.microbatch if k.name.endswith(".w.amax")]


def test_a_compiled_block_costs_the_host_its_launches_only() -> None:
    _, eager = _plan()
    job, compiled = _plan(compile=True)
    blocks = {la.name for la in job.model.layers if la.in_body}
    host = [k.host_s for k in compiled.microbatch if k.layer in blocks and k.name.endswith(".bwd")]
    assert host and max(host) < min(k.host_s for k in eager.microbatch
                                    if k.layer in blocks and k.name.endswith(".bwd"))


def test_the_output_says_the_run_is_compiled() -> None:
    result = estimate(**{**JOB, "compile": True})
    text = "\n".join(result.assumptions)
    assert "torch.compile" in text and "eager execution" not in text


def test_compiled_data_parallel_jobs_are_faster_too() -> None:
    kw = {**JOB, "num_gpus": 8, "batch_size": 8, "zero": 3}
    assert estimate(**kw, compile=True).step.step_time_s < estimate(**kw).step.step_time_s
