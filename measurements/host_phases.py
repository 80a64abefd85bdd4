"""Where the host's time goes in a models-suite training step: how long the CPU spends in
zero_grad, the forward (with the loss), backward() and the optimizer step, how long the GPU
then takes to drain what was queued, and how long a step takes when steps run back to back
(as training runs them) rather than one at a time after a synchronize (as the suite times
them). Optionally the peak memory of the same step under torch.compile.

Not calibration data (calibration fits the micro suite only): it tells which part of the
host model is wrong when host-bound steps miss.

    python measurements/host_phases.py OUT_DIR [--compile CASE_ID ...] [CASE_ID ...]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from gpusim.measure import models
from gpusim.measure.provenance import collect
from gpusim.measure.timing import synchronize
from gpusim.measure.torch_model import Network
from gpusim.workload.formats import model_from_spec

WARMUP = 5
STEPS = 20


def phases(case: models.ModelCase, device: torch.device) -> dict:
    models.set_precision_flags(case.precision, device)
    net = Network(model_from_spec(case.spec), case.batch_size, device, inplace=True)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    clock = time.perf_counter

    def step(marks: list[float] | None = None) -> None:
        opt.zero_grad(set_to_none=True)
        if marks is not None:
            marks.append(clock())
        with models.autocast(case.precision, device):
            loss = net()
        if marks is not None:
            marks.append(clock())
        loss.backward()
        if marks is not None:
            marks.append(clock())
        opt.step()
        if marks is not None:
            marks.append(clock())

    for _ in range(WARMUP):
        step()
    synchronize(device)
    rows: dict[str, list[float]] = {k: [] for k in
                                    ("zero_grad", "forward", "backward", "optimizer", "host",
                                     "drain", "synced_step")}
    for _ in range(STEPS):
        synchronize(device)
        t0 = clock()
        marks = [t0]
        step(marks)
        synchronize(device)
        t_end = clock()
        for name, a, b in zip(("zero_grad", "forward", "backward", "optimizer"),
                              marks, marks[1:], strict=False):
            rows[name].append(b - a)
        rows["host"].append(marks[-1] - t0)
        rows["drain"].append(t_end - marks[-1])
        rows["synced_step"].append(t_end - t0)
    synchronize(device)
    t0 = clock()
    for _ in range(STEPS):
        step()
    synchronize(device)
    back_to_back = (clock() - t0) / STEPS
    out = {"id": case.id, "back_to_back_step_s": back_to_back,
           **{f"{k}_s": statistics.median(v) for k, v in rows.items()}}
    return out


def compiled_peak(case: models.ModelCase, device: torch.device) -> dict:
    """Peak memory of the training step, eager and with the module under torch.compile."""
    out: dict = {"id": case.id}
    for mode in ("eager", "compile"):
        models.set_precision_flags(case.precision, device)
        net = Network(model_from_spec(case.spec), case.batch_size, device, inplace=True)
        module = torch.compile(net) if mode == "compile" else net
        opt = torch.optim.Adam(net.parameters(), lr=1e-4)
        began = time.perf_counter()
        for i in range(4):
            if i == 2:
                synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
            opt.zero_grad(set_to_none=True)
            with models.autocast(case.precision, device):
                loss = module()
            loss.backward()
            opt.step()
        synchronize(device)
        out[mode] = {"peak_memory_bytes": int(torch.cuda.max_memory_allocated(device)),
                     "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
                     "seconds_for_four_steps": time.perf_counter() - began}
        del net, module, opt
        torch.cuda.empty_cache()
    return out


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    args = sys.argv[2:]
    compile_ids = []
    if "--compile" in args:
        i = args.index("--compile")
        compile_ids, args = args[i + 1:], args[:i]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cases = {c.id: c for c in models.gpu_cases() + models.cpu_cases()}
    wanted = args or [c.id for c in models.gpu_cases()]
    result: dict = {"provenance": collect(device), "phases": [], "compiled": []}
    for cid in wanted:
        row = phases(cases[cid], device)
        result["phases"].append(row)
        print(f"{cid:32s} synced {row['synced_step_s'] * 1e3:8.3f} ms  back-to-back "
              f"{row['back_to_back_step_s'] * 1e3:8.3f}  host {row['host_s'] * 1e3:7.3f} = "
              f"zg {row['zero_grad_s'] * 1e3:.3f} fw {row['forward_s'] * 1e3:.3f} "
              f"bw {row['backward_s'] * 1e3:.3f} opt {row['optimizer_s'] * 1e3:.3f}  "
              f"drain {row['drain_s'] * 1e3:.3f}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for cid in compile_ids if device.type == "cuda" else []:
        try:
            row = compiled_peak(cases[cid], device)
        except Exception as exc:  # a compile failure is a finding, not a crash of the run
            row = {"id": cid, "error": f"{type(exc).__name__}: {exc}"[:500]}
        result["compiled"].append(row)
        print(json.dumps(row), flush=True)
        (out / "host_phases.json").write_text(json.dumps(result, indent=1))
    (out / "host_phases.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
