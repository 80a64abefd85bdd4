"""gpusim: predict deep-learning training time and cost on hardware you may not own.

>>> import gpusim
>>> result = gpusim.estimate("resnet50", "h100-sxm", 256, precision="bf16", steps=100)
>>> result.step.step_time_s > 0
True
"""

from gpusim.errors import (
    GpusimError,
    InvalidConfig,
    InvalidModel,
    InvalidProfile,
    OutOfMemory,
    UnknownHardware,
    UnknownModel,
)
from gpusim.estimate import build_job, estimate, simulate_step
from gpusim.hardware.catalog import load_cpu, load_device, load_gpu, load_link, load_system
from gpusim.plan.job import TrainingJob
from gpusim.plan.memory_report import MemoryReport, memory_report
from gpusim.report import StepResult, TrainingEstimate
from gpusim.workload import zoo
from gpusim.workload.from_torch import from_torch

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
