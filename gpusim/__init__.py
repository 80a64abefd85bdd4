"""gpusim: predict deep-learning training time and cost on hardware you may not own.

>>> import gpusim
>>> result = gpusim.estimate("resnet50", "h100-sxm", 256, precision="bf16", steps=100)
>>> result.step.step_time_s > 0
True
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpusim.errors import (
    GpusimError,
    InvalidConfig,
    InvalidModel,
    InvalidProfile,
    OutOfMemory,
    UnknownHardware,
    UnknownModel,
)

if TYPE_CHECKING:
    from gpusim.estimation import build_job, estimate, simulate_step
    from gpusim.hardware.catalog import (
        load_cpu,
        load_device,
        load_gpu,
        load_link,
        load_system,
    )
    from gpusim.plan.job import TrainingJob
    from gpusim.plan.memory_report import MemoryReport, memory_report
    from gpusim.report import StepResult, TrainingEstimate
    from gpusim.workload import zoo
    from gpusim.workload.from_torch import from_torch

# Public name -> the module that defines it, imported on first use (PEP 562), so that
# ``import gpusim`` builds no pydantic models and parses no profiles until asked. (No name
# here is also a submodule of gpusim, whose import would rebind it: hence estimation.py.)
_LAZY = {
    "build_job": "gpusim.estimation", "estimate": "gpusim.estimation",
    "simulate_step": "gpusim.estimation",
    "load_cpu": "gpusim.hardware.catalog", "load_device": "gpusim.hardware.catalog",
    "load_gpu": "gpusim.hardware.catalog", "load_link": "gpusim.hardware.catalog",
    "load_system": "gpusim.hardware.catalog",
    "TrainingJob": "gpusim.plan.job",
    "MemoryReport": "gpusim.plan.memory_report", "memory_report": "gpusim.plan.memory_report",
    "StepResult": "gpusim.report", "TrainingEstimate": "gpusim.report",
    "zoo": "gpusim.workload.zoo",
    "from_torch": "gpusim.workload.from_torch",
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'gpusim' has no attribute {name!r}")
    module = importlib.import_module(where)
    value = module if name == "zoo" else getattr(module, name)
    globals()[name] = value  # later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "GpusimError",
    "InvalidConfig",
    "InvalidModel",
    "InvalidProfile",
    "MemoryReport",
    "OutOfMemory",
    "StepResult",
    "TrainingEstimate",
    "TrainingJob",
    "UnknownHardware",
    "UnknownModel",
    "build_job",
    "estimate",
    "from_torch",
    "load_cpu",
    "load_device",
    "load_gpu",
    "load_link",
    "load_system",
    "memory_report",
    "simulate_step",
    "zoo",
]
__version__ = "0.1.0"
