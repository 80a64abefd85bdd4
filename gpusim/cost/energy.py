"""Device power and energy from the simulated utilization.

A device draws its idle power all the time, and on top of it a share of (limit - idle) in
proportion to how hard its busiest unit works. A kernel works its bottleneck unit (matrix or
vector cores for compute-bound kernels, DRAM for memory-bound ones) at the attainable rate
for the roofline part of its time, and not during its ramp and fixed per-kernel overhead, so
its active time is the larger of its compute and memory times. Gaps in the stream (host
dispatch, input waits, exposed communication, pipeline bubbles) draw idle power only.
"""

from __future__ import annotations

from gpusim.cost.kernels import KernelCost
from gpusim.hardware.calibration import Calibration
from gpusim.hardware.profile import DeviceProfile


def active_seconds(cost: KernelCost) -> float:
    """Seconds of the kernel spent working its bottleneck unit at the attainable rate."""
    return min(cost.seconds, max(cost.compute_s, cost.memory_s))


def idle_power_w(device: DeviceProfile, cal: Calibration) -> float:
    return cal.idle_power_fraction * device.tdp_w


def average_power_w(device: DeviceProfile, cal: Calibration, active_fraction: float) -> float:
    """Mean board power over a step whose active share of the time is ``active_fraction``."""
    idle = idle_power_w(device, cal)
    return idle + (device.power_limit - idle) * min(1.0, max(0.0, active_fraction))
