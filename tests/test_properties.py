"""Properties of whole steps that any correct model keeps, checked on drawn jobs: a slower
device is never faster, a larger batch never takes less time a step, one GPU and N
data-parallel GPUs cost a replica alike, and results do not depend on the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusim.errors import GpusimError
from gpusim.estimation import estimate
from gpusim.explore.values import with_fields
from gpusim.hardware.catalog import load_gpu

MODELS = ["mnist-mlp", "resnet50", "gpt2", "bert-base", "vit-b16"]
GPUS = ["h100-sxm", "a100-80gb", "rtx-4090", "l4"]
PROPERTY = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])

jobs = st.fixed_dictionaries({
    "model": st.sampled_from(MODELS),
    "gpu": st.sampled_from(GPUS),
    "batch_size": st.sampled_from([1, 4, 16, 64]),
    "precision": st.sampled_from(["fp32", "bf16", "auto"]),
    "loader_workers": st.sampled_from([0, 8]),
})


def _step(job: dict, **overrides: object) -> float | None:
    try:
        return estimate(**{**job, **overrides}).step.step_time_s
    except GpusimError:  # out of memory, say: no step to compare
        return None


@PROPERTY
@given(jobs, st.sampled_from(["memory_bandwidth_gb_s", "matrix_tflops.bf16",
                              "vector_tflops.fp32"]),
       st.floats(min_value=0.2, max_value=0.9))
def test_a_slower_device_never_trains_faster(job: dict, field: str, scale: float) -> None:
    gpu = load_gpu(job["gpu"])
    base = gpu.model_dump()
    key, _, sub = field.partition(".")
    value = base[key][sub] if sub else base[key]
    slower = with_fields(gpu, {field: value * scale})
    fast, slow = _step(job), _step(job, gpu=slower)
    if fast is not None and slow is not None:
        assert slow >= fast * (1 - 1e-9), (job, field, scale)


@PROPERTY
@given(jobs)
def test_a_larger_batch_never_takes_less_time_a_step(job: dict) -> None:
    small, large = _step(job), _step(job, batch_size=2 * job["batch_size"])
    if small is not None and large is not None:
        assert large >= small * (1 - 1e-9), job


@PROPERTY
@given(jobs, st.sampled_from([2, 8]))
def test_one_gpu_and_n_data_parallel_gpus_cost_a_replica_alike(job: dict, n: int) -> None:
    """The same microbatch on each of N GPUs: forward and backward kernels and the host's
    dispatch of them cost what one GPU pays (within 1%)."""
    if load_gpu(job["gpu"]).name == "l4":
        job = {**job, "gpu": "h100-sxm"}
    try:
        one = estimate(**job).step.breakdown_s
        many = estimate(**{**job, "batch_size": n * job["batch_size"], "num_gpus": n}
                        ).step.breakdown_s
    except GpusimError:
        return
    for part in ("forward", "backward"):
        assert many[part] == pytest.approx(one[part], rel=0.01, abs=1e-6), (job, n, part)


def test_results_do_not_depend_on_the_process_or_its_hash_seed() -> None:
    argv = [sys.executable, "-m", "gpusim", "estimate", "--model", "gpt2", "--gpu", "h100-sxm",
            "--batch-size", "16", "--num-gpus", "4", "--zero", "1", "--json"]
    outputs = []
    for seed in ("0", "12345"):
        done = subprocess.run(argv, capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        outputs.append(json.loads(done.stdout))
    assert outputs[0] == outputs[1]
