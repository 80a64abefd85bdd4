"""Sustained clocks under a board power limit.

A GPU holds its boost clock only while the board stays under its power limit. Dense matrix
work at the boost clock draws more than a recent part's limit, so the firmware lowers the
clock until the power fits. The power that falls with the clock (the cores' switching) goes
about as the clock to a power near 3, since the voltage falls with it; the rest (leakage,
memory, the board) does not, and is taken as the device's idle power.

So a board limited to ``P`` runs matrix-bound kernels at the clock fraction

    ((P - idle) / (demand - idle)) ** (1 / exponent), at most 1,

where ``demand`` is what the same work would draw at the boost clock and ``idle`` the part
that does not fall with the clock (the device's idle power, or a fitted static power where a
sweep spans enough limits to place it). They and ``exponent`` are fitted per architecture on
published power-limit sweeps of GEMMs (``gpusim.calibrate.power``). The efficiencies of a
calibration were measured at the measured device's own limit, so a kernel's compute rate
scales by the clock fraction at the run's limit over the fraction at the limit the
calibration was measured under. Memory-bound kernels keep their rate: the HBM clock is not
lowered, and they draw less than the limit.

Powers are fractions of the measured device's TDP. Another device of the architecture is put
on that scale by the size of its die's switching work: its demand grows with its compute
units times its boost clock, so an MI325X (the MI300X's die, allowed 1000 W against 750 W)
keeps a higher clock, and an H100 PCIe (114 SMs at 1755 MHz, 350 W) a lower one than the
H100 SXM the fit was measured on.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError

from gpusim.errors import InvalidConfig, InvalidProfile
from gpusim.hardware.catalog import format_validation_error, load_gpu, profiles_dir, read_yaml
from gpusim.hardware.profile import DeviceProfile, Frozen

Positive = Annotated[float, Field(gt=0)]


class PowerCalibration(Frozen):
    """How one architecture's matrix throughput falls under a board power limit."""

    kind: Literal["power_calibration"] = "power_calibration"
    name: str
    architecture: str
    demand_fraction: Positive = Field(
        description="board power dense matrix kernels would draw at the boost clock, as a "
                    "fraction of TDP (above 1: clocked down even at TDP)")
    exponent: Annotated[float, Field(ge=1, le=4)] = Field(
        description="the clock-dependent power grows as the clock to this power")
    measured_limit_fraction: Annotated[float, Field(gt=0, le=1)] = Field(
        1.0, description="the power limit, as a fraction of TDP, of the device the "
                         "architecture's efficiencies were measured on")
    static_fraction: Annotated[float, Field(ge=0, lt=1)] | None = Field(
        None, description="the board power under load that does not scale with the clock "
                          "(leakage, memory, the board), as a fraction of TDP; None: the "
                          "architecture's idle power")
    measured_device: str | None = Field(
        None, description="the device the architecture's efficiencies were measured on: "
                          "powers are fractions of its TDP, other devices' scaled to its die "
                          "(None: each device's own TDP)")
    fitted_on: list[str] = Field(default_factory=list, description="the published sweeps")
    rationale: str = ""


def clock_fraction(limit_fraction: float, idle_fraction: float,
                   power: PowerCalibration) -> float:
    """The fraction of its boost clock a board held to ``limit_fraction`` of its TDP runs
    dense matrix work at (idle power ``idle_fraction`` of TDP)."""
    if limit_fraction >= power.demand_fraction:
        return 1.0
    headroom = max(limit_fraction - idle_fraction, 1e-3)
    return float((headroom / (power.demand_fraction - idle_fraction)) ** (1 / power.exponent))


def on_reference_scale(device: DeviceProfile, watts: float, idle_fraction: float,
                       measured_device: str | None) -> tuple[float, float]:
    """``device``'s limit ``watts`` and its idle power (``idle_fraction`` of its TDP) as
    fractions of the measured device's TDP, scaled to its die: the demand of a die grows
    with its compute units times its boost clock."""
    if measured_device is None or measured_device == device.name:
        return watts / device.tdp_w, idle_fraction
    ref = _reference(measured_device)
    scale = ref.tdp_w * (device.compute_units * device.boost_clock_mhz) / (
        ref.compute_units * ref.boost_clock_mhz)
    return watts / scale, idle_fraction * device.tdp_w / scale


@lru_cache(maxsize=16)
def _reference(name: str) -> DeviceProfile:
    return load_gpu(name)


def compute_rate_factor(device: DeviceProfile, idle_fraction: float,
                        power: PowerCalibration | None) -> float:
    """How much faster (above 1) or slower (below 1) compute-bound kernels run on
    ``device`` under its power limit than on the device its calibration was measured on
    under that one's limit; without a power calibration, its measured sustained clock's
    share of the boost clock (1 where none was measured)."""
    if power is None:
        sustained = device.sustained_clock_mhz
        return 1.0 if sustained is None else sustained / device.boost_clock_mhz
    static = idle_fraction if power.static_fraction is None else power.static_fraction
    run = clock_fraction(*on_reference_scale(device, device.power_limit, static,
                                             power.measured_device), power)
    measured = clock_fraction(power.measured_limit_fraction, static, power)
    return run / measured


def with_power_limit(device: DeviceProfile, watts: float, idle_fraction: float
                     ) -> DeviceProfile:
    """``device`` set to run under a board power limit of ``watts`` (as nvidia-smi -pl)."""
    if not watts <= device.tdp_w:
        raise InvalidConfig(f"--power-limit {watts:g} W is above {device.name}'s TDP "
                            f"({device.tdp_w:g} W); a board cannot be set above it")
    idle = idle_fraction * device.tdp_w
    if not watts > idle:
        raise InvalidConfig(f"--power-limit {watts:g} W is not above {device.name}'s idle "
                            f"power ({idle:.0f} W): nothing would be left to compute with")
    return device.model_copy(update={"power_limit_w": float(watts)})


def load_power_file(path: str | Path) -> PowerCalibration:
    path = Path(path)
    try:
        return PowerCalibration.model_validate(read_yaml(path))
    except ValidationError as exc:
        raise InvalidProfile(format_validation_error(str(path), exc, PowerCalibration)) \
            from exc


def power_file(architecture: str) -> Path:
    return profiles_dir() / "calibration" / "power" / f"{architecture}.yaml"


@lru_cache(maxsize=16)
def _power_for(root: str, architecture: str) -> PowerCalibration | None:
    path = Path(root) / "calibration" / "power" / f"{architecture}.yaml"
    return load_power_file(path) if path.exists() else None


def power_calibration_for(device: DeviceProfile) -> PowerCalibration | None:
    """The power calibration of ``device``'s architecture, or None when none was fitted."""
    return _power_for(str(profiles_dir()), device.architecture)
