"""FP32 matrix work on SMs that share half their FP32 lanes with INT32 (Ampere GA10x, Ada
AD10x; GPUProfile.fp32_lanes_shared_with_int32).

The datasheet's FP32 peak counts every lane, but a product's inner loop also issues integer
work (addresses, loop counts) on the shared ones, so it reaches less of that peak than an SM
whose INT32 lanes are its own (GA100, Hopper, Volta), on which the calibrations' fp32
efficiencies were fitted or stated. The factor is the median, over published SGEMM timings
on such SMs (measurements/published/shared_fp32_lanes.yaml), of the rate measured over the
rate the device's calibration gives without it.
"""

from __future__ import annotations

import statistics
from functools import lru_cache

from gpusim.data import data_dir
from gpusim.hardware.calibration import calibration_for
from gpusim.hardware.catalog import load_gpu, read_yaml
from gpusim.hardware.profile import DeviceProfile, GPUProfile

SHARED_LANES_FILE = data_dir("measurements") / "published" / "shared_fp32_lanes.yaml"


def shares_fp32_lanes(device: DeviceProfile, math: str) -> bool:
    """Whether ``math`` products run on FP32 lanes the device shares with INT32 work."""
    return (math == "fp32" and isinstance(device, GPUProfile)
            and bool(device.fp32_lanes_shared_with_int32)
            and "fp32" not in device.matrix_tflops)


@lru_cache(maxsize=1)
def shared_lane_factor() -> float:
    """What an SGEMM reaches on a shared-lane SM, as a share of its calibration's rate."""
    shares = []
    for row in read_yaml(SHARED_LANES_FILE)["rows"]:
        gpu = load_gpu(row["gpu"])
        peak, _ = gpu.peak_flops("fp32", matrix=True)
        shares.append(float(row["tflops"]) * 1e12
                      / (peak * calibration_for(gpu).gemm_efficiency("fp32")))
    return statistics.median(shares)
