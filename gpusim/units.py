"""Every unit conversion, once.

Inside gpusim, time is in seconds, sizes in bytes, work in FLOP and rates in FLOP/s or bytes/s.
Files and outputs name their units in their keys (``memory_bandwidth_gb_s``); these helpers
convert at the edges.
"""

from __future__ import annotations

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KIB = 2.0**10
MIB = 2.0**20
GIB = 2.0**30

TERA = 1e12
GIGA = 1e9
MEGA = 1e6

US = 1e-6
MS = 1e-3
HOUR = 3600.0
DAY = 86400.0

JOULES_PER_KWH = 3.6e6


def gb_s(value: float) -> float:
    """Decimal gigabytes per second to bytes per second."""
    return value * GB


def tflops(value: float) -> float:
    """TFLOP/s to FLOP/s."""
    return value * TERA


def gib(value: float) -> float:
    """Binary gibibytes to bytes."""
    return value * GIB


def mib(value: float) -> float:
    """Binary mebibytes to bytes."""
    return value * MIB


def us(value: float) -> float:
    """Microseconds to seconds."""
    return value * US


def mhz(value: float) -> float:
    """Megahertz to hertz."""
    return value * MEGA


def to_gib(n_bytes: float) -> float:
    """Bytes to binary gibibytes."""
    return n_bytes / GIB


def to_hours(seconds: float) -> float:
    return seconds / HOUR


def to_kwh(joules: float) -> float:
    return joules / JOULES_PER_KWH


def human_seconds(seconds: float) -> str:
    """A duration as a person reads it: 12.3 ms, 4.5 s, 3.2 h, 12.0 days."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    if seconds < 120.0:
        return f"{seconds:.2f} s"
    if seconds < 2 * HOUR:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * DAY:
        return f"{seconds / HOUR:.1f} h"
    return f"{seconds / DAY:.1f} days"


def human_bytes(n_bytes: float) -> str:
    """A size in binary units: 512.0 MiB, 12.3 GiB."""
    for unit, scale in (("TiB", 2.0**40), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:.2f} {unit}"
    return f"{n_bytes:.0f} B"


def human_count(n: float) -> str:
    """A large count: 25.6M, 175.0B, 4.1G."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"
