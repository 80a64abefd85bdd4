"""Where a measured training step's time goes: torch.profiler over a few steps of chosen
models-suite cases, as tables of kernels (device time) and ops (host time), one file per case.

Not calibration data: it tells which kernels a step runs, how many, and whether the host or
the device sets the pace, so that a wrong term in the model can be found and fixed.

    python measurements/profile_steps.py OUT_DIR CASE_ID [CASE_ID ...]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from gpusim.measure import models
from gpusim.measure.timing import synchronize
from gpusim.measure.torch_model import Network
from gpusim.workload.formats import model_from_spec

STEPS = 5


def _step_fn(net: Network, case: models.ModelCase, device: torch.device):
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with models.autocast(case.precision, device):
            loss = net()
        loss.backward()
        opt.step()

    return step


def profile_case(case: models.ModelCase, device: torch.device) -> dict:
    models.set_precision_flags(case.precision, device)
    net = Network(model_from_spec(case.spec), case.batch_size, device, inplace=True)
    step = _step_fn(net, case, device)
    for _ in range(5):
        step()
    synchronize(device)
    began = time.perf_counter()
    for _ in range(STEPS):
        step()
    synchronize(device)
    wall = (time.perf_counter() - began) / STEPS
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        synchronize(device)
    events = prof.key_averages()
    kernels = sorted((e for e in events if e.device_time_total > 0 and e.device_type.name != "CPU"),
                     key=lambda e: -e.device_time_total)
    ops = sorted((e for e in events if e.device_type.name == "CPU"),
                 key=lambda e: -e.self_cpu_time_total)
    busy = sum(e.device_time_total for e in kernels) / 1e6 / STEPS
    return {
        "id": case.id, "step_s": wall, "kernel_busy_s": busy,
        "kernels": [{"name": e.key[:160], "calls": e.count // STEPS,
                     "seconds": e.device_time_total / 1e6 / STEPS} for e in kernels[:60]],
        "kernel_launches": sum(e.count for e in kernels) // STEPS,
        "host_ops": [{"name": e.key[:120], "calls": e.count // STEPS,
                      "self_seconds": e.self_cpu_time_total / 1e6 / STEPS} for e in ops[:40]],
    }


def main() -> None:
    out = Path(sys.argv[1])
    wanted = sys.argv[2:]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cases = {c.id: c for c in models.gpu_cases() + models.cpu_cases()}
    results = []
    for cid in wanted:
        row = profile_case(cases[cid], device)
        results.append(row)
        print(f"{cid}: step {row['step_s'] * 1e3:.2f} ms, kernels busy "
              f"{row['kernel_busy_s'] * 1e3:.2f} ms, {row['kernel_launches']} launches")
        for k in row["kernels"][:12]:
            print(f"    {k['seconds'] * 1e3:8.3f} ms {k['calls']:5d}x  {k['name'][:90]}")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    (out / "profiles.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
