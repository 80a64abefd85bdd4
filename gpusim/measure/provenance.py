"""Where a measurement came from: device, software versions, clocks, date, command, commit.

Nothing here names a path or host of the machine, only what identifies the hardware and
software, so measurement files can be committed as they are.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch


def _run(args: list[str]) -> str | None:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def gpu_clocks() -> dict[str, str] | None:
    """SM and memory clocks now and at most, as nvidia-smi reports them (None without it)."""
    fields = "clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,temperature.gpu"
    out = _run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"])
    if not out:
        return None
    values = [v.strip() for v in out.splitlines()[0].split(",")]
    return dict(zip(fields.split(","), values, strict=False))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# Instruction-set features that place a CPU's generation when a virtual machine hides its
# model name ("Intel(R) Xeon(R) Processor"): AMX came with Sapphire Rapids, AVX-512 BF16
# with Cooper Lake and Zen 4, AVX-512 with Skylake-SP and Zen 4.
CPU_FEATURES = ("amx_tile", "amx_bf16", "avx512_bf16", "avx512f", "avx2")


def cpu_identity(cpuinfo: str | None = None) -> dict[str, Any]:
    """What identifies the host CPU beyond its model name: vendor, family, model and
    stepping numbers (a microarchitecture even where a VM masks the name), cache size, the
    clock the kernel reports now, and the generation-placing features it has. Host-side
    costs (a kernel launch, a Python op) scale with the CPU, and the lent machines' names
    are masked. ``cpuinfo``: /proc/cpuinfo's text (read when not given)."""
    fields = {"vendor_id": "vendor", "cpu family": "family", "model": "model",
              "stepping": "stepping", "cache size": "cache", "cpu MHz": "mhz"}
    found: dict[str, Any] = {}
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return found
    for line in cpuinfo.split("\n\n", 1)[0].splitlines():  # the first processor's block
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in fields:
            found[fields[key]] = value
        elif key == "flags":
            have = set(value.split())
            found["features"] = [f for f in CPU_FEATURES if f in have]
    return found


def _git_commit() -> str:
    root = Path(__file__).resolve().parents[2]
    return _run(["git", "-C", str(root), "rev-parse", "HEAD"]) or "unknown"


def _without_machine_paths(args: list[str]) -> list[str]:
    """The command as run, with each absolute path cut to its last two parts (the output
    folder's place on the machine that measured says nothing and names that machine)."""
    return [str(Path(*Path(a).parts[-2:])) if os.path.isabs(a) else a for a in args]


def collect(device: torch.device) -> dict[str, Any]:
    """Provenance of a run on ``device``, taken before it starts."""
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "gpusim " + " ".join(_without_machine_paths(sys.argv[1:])),
        "git_commit": _git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "os": f"{platform.system()} {platform.release()}",
        "cpu": _cpu_model(),
        "cpu_identity": cpu_identity(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update({
            "gpu": props.name,
            "sm_count": props.multi_processor_count,
            "gpu_memory_bytes": props.total_memory,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "driver": _run(["nvidia-smi", "--query-gpu=driver_version",
                            "--format=csv,noheader"]),
            "clocks_before": gpu_clocks(),
        })
    return info


def switches(device: torch.device) -> dict[str, Any]:
    """Every setting that changes the answer, as it stood."""
    # tied_weights: a tied head shares its token table's weight (files without this key
    # were measured with the head's own copy); rotary: rotary models apply their rotary
    # embedding (files without it ran them with no position encoding)
    out: dict[str, Any] = {"channels_last": False, "torch_compile": False, "cuda_graphs": False,
                           "tied_weights": True, "rotary": True}
    if device.type == "cuda":
        out.update({
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        })
    else:
        out["mkldnn"] = torch.backends.mkldnn.is_available()
    return out
