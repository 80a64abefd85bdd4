"""Plausibility warnings: figures a profile may state but no real hardware of its kind has.

A profile can keep every schema rule and still carry a unit slip: 2 (TB/s) in a GB/s field,
400,000 (GFLOP/s) in a TFLOP/s one, 1.98 (GHz) for MHz, 1 (kW) for watts; or a name that is
already a shipped profile's. These are warnings, not errors: hardware outside the shipped range
exists (a Jetson, next year's GPU) and the user may mean it.

Ranges come from the shipped profiles, not from constants: each figure is compared with the same
figure over the shipped profiles of its kind (GPU, CPU, a link family, system), from the
smallest to the largest, widened by ``WIDEN`` at either end. A unit slip is a factor of 1000, so
a slip from any value under 100 times the smallest shipped one (or over a hundredth of the
largest) lands outside; shipped figures mostly span less than that (GPU memory bandwidth 33x),
while the factor of 10 leaves room for real devices smaller or newer than any shipped.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpusim.hardware.catalog import catalog, normalize
from gpusim.hardware.profile import (
    CPUProfile,
    DeviceProfile,
    GPUProfile,
    HardwareProfile,
    LinkProfile,
    SystemProfile,
    source_key_problem,
)

WIDEN = 10.0
"""How far beyond the shipped extremes a figure may go before it is called implausible."""

MIN_SHIPPED = 3
"""Fewer shipped values than this make no range: the comparison falls back to a wider pool
(every precision of a table, every device, every link)."""


@dataclass(frozen=True)
class _Figure:
    """One figure of a profile, as compared."""

    key: str  # where the file states it: "memory_gib", "matrix_tflops.bf16", "cloud_prices[0]..."
    value: float  # as compared (per GPU for a system's power and price)
    unit: str
    low: str  # the likely slip when the value is too small ("" when none comes to mind)
    high: str  # and when too large
    measure: str = ""  # what it is pooled as across profiles; ``key`` when empty
    compare: tuple[tuple[str, str], ...] = ()  # (class, measure) pools to compare with, when
    #                                            not the profile's own classes and measure
    shown: str = ""  # the value as the warning gives it, verb included, when it is derived

    @property
    def pooled_as(self) -> str:
        return self.measure or self.key


def plausibility_warnings(profile: HardwareProfile,
                          shipped: Iterable[HardwareProfile] | None = None) -> list[str]:
    """One line per figure of ``profile`` outside what real hardware of its kind has (naming
    the field, the value and unit, the plausible range and the likely slip), per name that is
    a ``shipped`` profile's, and per source keyed by no figure. ``shipped`` defaults to the
    shipped catalog; a shipped profile checked as itself draws no name warning."""
    if shipped is None:
        cat = catalog()
        shipped = [*cat.all(GPUProfile), *cat.all(CPUProfile), *cat.all(LinkProfile),
                   *cat.all(SystemProfile)]
    shipped = list(shipped)
    pools = _pools(shipped)
    warnings = [w for fig in _figures(profile) if (w := _range_warning(profile, fig, pools))]
    warnings += _ethernet_bits_warnings(profile)
    warnings += _name_warnings(profile, shipped)
    warnings += _source_key_warnings(profile)
    return warnings


# -- figures ---------------------------------------------------------------------------------

_TFLOPS_LOW, _TFLOPS_HIGH = "was PFLOP/s meant?", "was GFLOP/s meant?"
_LANES_RATIO = "vector_tflops.fp32 / (cuda_cores x 2 x boost clock)"
_MEASURE_NAMES = {
    "purchase_usd": "purchase price (launch_price_usd or street_prices)",
    "usd_per_device_hour": "cloud price per device-hour",
    _LANES_RATIO: "ratio",
    "vector_tflops": "vector_tflops (any precision)",
    "matrix_tflops": "matrix_tflops (any precision)",
    "tflops": "peak (any table or precision)",
}
_CLASS_NAMES = {"GPU or CPU": ("GPU's or CPU's", "GPUs and CPUs")}


def _figures(p: HardwareProfile) -> list[_Figure]:
    if isinstance(p, DeviceProfile):
        return _device_figures(p)
    if isinstance(p, LinkProfile):
        return [
            _Figure("bandwidth_gb_s", p.bandwidth_gb_s, "GB/s", "was TB/s meant?",
                    "bandwidth_gb_s is one link's (or port's) in one direction: is this a total "
                    "over links, both directions, or Gb/s (bits)?"),
            _Figure("latency_us", p.latency_us, "us", "was ms meant?", "was ns meant?"),
        ]
    return _system_figures(p)


def _device_figures(p: DeviceProfile) -> list[_Figure]:
    gpu = isinstance(p, GPUProfile)
    figs = [
        _Figure("compute_units", p.compute_units, "", "",
                "compute_units counts SMs (CUs on AMD), not the CUDA cores inside them "
                "(cuda_cores)" if gpu else "compute_units counts physical cores"),
        _Figure("boost_clock_mhz", p.boost_clock_mhz, "MHz", "was GHz meant?",
                "was kHz or Hz meant?"),
        _Figure("memory_gib", p.memory_gib, "GiB", "was TiB meant?", "was MiB (or bytes) meant?"),
        _Figure("memory_bandwidth_gb_s", p.memory_bandwidth_gb_s, "GB/s", "was TB/s meant?",
                "was MB/s meant?"),
        _Figure("tdp_w", p.tdp_w, "W", "was kW meant?", "was mW meant, or a whole node's power?"),
    ]
    if p.base_clock_mhz is not None:
        figs.append(_Figure("base_clock_mhz", p.base_clock_mhz, "MHz", "was GHz meant?",
                            "was kHz or Hz meant?"))
    for table, peaks in (("vector_tflops", p.vector_tflops), ("matrix_tflops", p.matrix_tflops)):
        figs += [_Figure(f"{table}.{precision}", value, "TFLOP/s", _TFLOPS_LOW, _TFLOPS_HIGH)
                 for precision, value in peaks.items()]
    price_high = "is this a whole system's price rather than one device's?"
    if p.launch_price_usd is not None:
        figs.append(_Figure("launch_price_usd", p.launch_price_usd, "USD",
                            "was thousands of USD meant?", price_high, measure="purchase_usd"))
    figs += [_Figure(f"street_prices[{i}].usd", q.usd, "USD", "was thousands of USD meant?",
                     price_high, measure="purchase_usd") for i, q in enumerate(p.street_prices)]
    figs += [_Figure(f"cloud_prices[{i}].usd_per_hour", q.usd_per_hour, "USD/h",
                     "is this per minute or per second rather than per hour?",
                     "is this a whole instance's hourly price rather than one device's, or a "
                     "monthly price?", measure="usd_per_device_hour")
             for i, q in enumerate(p.cloud_prices)]
    if isinstance(p, GPUProfile):
        figs += _gpu_figures(p)
    elif isinstance(p, CPUProfile):
        figs.append(_Figure("threads", p.threads, "", "", ""))
        if p.l3_cache_mib is not None:
            figs.append(_Figure("l3_cache_mib", p.l3_cache_mib, "MiB", "was GiB meant?",
                                "was KiB meant?"))
        if p.memory_channels is not None:
            figs.append(_Figure("memory_channels", p.memory_channels, "", "", ""))
    return figs


def _gpu_figures(p: GPUProfile) -> list[_Figure]:
    figs = []
    if p.cuda_cores is not None:
        figs.append(_Figure("cuda_cores", p.cuda_cores, "",
                            "cuda_cores counts FP32 lanes (CUDA cores, stream processors), "
                            "not SMs", ""))
        # The FP32 vector peak is lanes x 2 (an FMA) x clock on every shipped GPU (twice that
        # on CDNA3's dual issue); far from it, one of the three is off.
        lanes_peak = p.cuda_cores * 2 * p.boost_clock_mhz * 1e6 / 1e12
        ratio = p.vector_tflops["fp32"] / lanes_peak
        check = ("check that cuda_cores counts FP32 lanes (not SMs), boost_clock_mhz is in MHz "
                 "and vector_tflops in TFLOP/s")
        figs.append(_Figure(
            "vector_tflops.fp32", ratio, "", check, check, measure=_LANES_RATIO,
            shown=f"{_num(p.vector_tflops['fp32'])} TFLOP/s is {_num(ratio)} times cuda_cores "
                  f"x 2 x boost_clock_mhz ({_num(lanes_peak)} TFLOP/s),"))
    if p.tensor_cores is not None:
        figs.append(_Figure("tensor_cores", p.tensor_cores, "", "was the count per SM meant?",
                            ""))
    if p.l2_cache_mib is not None:
        figs.append(_Figure("l2_cache_mib", p.l2_cache_mib, "MiB", "was GiB meant?",
                            "was KiB meant?"))
    if p.nvlink_bandwidth_gb_s is not None:
        figs.append(_Figure("nvlink_bandwidth_gb_s", p.nvlink_bandwidth_gb_s, "GB/s",
                            "was TB/s meant?", "was MB/s meant?"))
    return figs


def _system_figures(p: SystemProfile) -> list[_Figure]:
    n = p.gpus_per_node
    figs = [_Figure("gpus_per_node", n, "", "",
                    "is this the GPUs of several nodes rather than one?")]
    if p.host_memory_gib is not None:
        figs.append(_Figure("host_memory_gib", p.host_memory_gib, "GiB", "was TiB meant?",
                            "was MiB (or bytes) meant?"))
    # A node draws at least its GPUs' power and costs at least their price, and its other parts
    # draw and cost less than the GPUs do, so per GPU it falls in the GPUs' own range (the
    # shipped systems: 1.3-1.8x their GPUs' TDP and 0.7-1.2x their price).
    if p.power_w is not None:
        figs.append(_Figure("power_w", p.power_w / n, "W", "was kW meant?", "was mW meant?",
                            measure="power_w per GPU", compare=(("GPU", "tdp_w"),),
                            shown=f"{_num(p.power_w / n)} W per GPU ({_num(p.power_w)} W over "
                                  f"{n} GPUs) is"))
    if p.launch_price_usd is not None:
        figs.append(_Figure("launch_price_usd", p.launch_price_usd / n, "USD",
                            "was thousands of USD meant?",
                            "is this several nodes' price rather than one?",
                            measure="launch_price_usd per GPU",
                            compare=(("GPU", "purchase_usd"),),
                            shown=f"{_num(p.launch_price_usd / n)} USD per GPU "
                                  f"({_num(p.launch_price_usd)} USD over {n} GPUs) is"))
    return figs


# -- ranges ----------------------------------------------------------------------------------

_Pools = dict[tuple[str, str], list[tuple[float, str]]]


def _classes(p: HardwareProfile) -> tuple[str, ...]:
    """The kinds ``p`` is compared within, narrowest first."""
    if isinstance(p, GPUProfile):
        return ("GPU", "GPU or CPU")
    if isinstance(p, CPUProfile):
        return ("CPU", "GPU or CPU")
    if isinstance(p, LinkProfile):
        return (f"{p.family} link", "link")
    return ("system",)


def _tables(measure: str) -> tuple[str, ...]:
    """The wider measures a per-precision peak falls back to: its table (every precision),
    then every peak of the device (a CPU's few matrix figures among its vector ones)."""
    head, dot, _ = measure.partition(".")
    return (head, "tflops") if dot and head.endswith("_tflops") and " " not in measure else ()


def _measures(fig: _Figure) -> tuple[str, ...]:
    return (fig.pooled_as, *_tables(fig.pooled_as))


def _pools(shipped: list[HardwareProfile]) -> _Pools:
    pools: _Pools = {}
    for s in shipped:
        for fig in _figures(s):
            for cls in _classes(s):
                for measure in _measures(fig):
                    pools.setdefault((cls, measure), []).append((fig.value, s.name))
    return pools


def _range_warning(p: HardwareProfile, fig: _Figure, pools: _Pools) -> str | None:
    chain = fig.compare or tuple((cls, measure) for cls in _classes(p)
                                 for measure in _measures(fig))
    for cls, measure in chain:
        values = pools.get((cls, measure), [])
        if len(values) >= MIN_SHIPPED:
            break
    else:
        return None
    (smallest, small_name), (largest, large_name) = min(values), max(values)
    lo, hi = smallest / WIDEN, largest * WIDEN
    if lo <= fig.value <= hi:
        return None
    below = fig.value < lo
    what = "" if measure == fig.key else " " + _MEASURE_NAMES.get(measure, measure)
    hint = fig.low if below else fig.high
    shown = fig.shown or f"{_quantity(fig.value, fig.unit)} is"
    any_, plural = _CLASS_NAMES.get(cls, (f"{cls}'s", f"{cls}s"))
    return (f"{fig.key} {shown} {'below' if below else 'above'} any {any_}{what}: "
            f"shipped {plural} span {_quantity(smallest, fig.unit)} ({small_name}) to "
            f"{_quantity(largest, fig.unit)} ({large_name}), so {_num(lo)} to "
            f"{_quantity(hi, fig.unit)} is plausible ({WIDEN:g}x beyond either end)"
            + (f"; {hint}" if hint else ""))


def _ethernet_bits_warnings(p: HardwareProfile) -> list[str]:
    """A link whose generation names its speed in Gb/s (``400GbE``) and whose bandwidth_gb_s
    is that number: bits were written for bytes (a 400 Gb/s port carries 50 GB/s)."""
    if not isinstance(p, LinkProfile):
        return []
    speed = re.match(r"(\d+(?:\.\d+)?)\s*G", p.generation)
    if speed is None or float(speed[1]) != p.bandwidth_gb_s:
        return []
    gbit = speed[1]
    return [f"bandwidth_gb_s {_num(p.bandwidth_gb_s)} GB/s is the {gbit} Gb/s that "
            f"generation {p.generation!r} names, in bits: a {gbit} Gb/s port carries "
            f"{_num(float(gbit) / 8)} GB/s; was Gb/s meant?"]


# -- names and sources -----------------------------------------------------------------------


def _name_warnings(p: HardwareProfile, shipped: list[HardwareProfile]) -> list[str]:
    """The user's name, full name or aliases that a shipped profile also answers to (its file
    would be taken for the shipped one, and the two cannot share a profiles folder)."""
    index: dict[str, tuple[HardwareProfile, str, str]] = {}
    for s in shipped:
        if s == p:  # the shipped profile itself, checked in place
            continue
        for what, text in [("alias", a) for a in s.aliases] + [("full_name", s.full_name),
                                                                ("name", s.name)]:
            index[normalize(text)] = (s, what, text)
    warnings = []
    for what, text in [("name", p.name), ("full_name", p.full_name),
                       *(("alias", a) for a in p.aliases)]:
        found = index.get(normalize(text))
        if found is None:
            continue
        s, its_what, its_text = found
        if what == "name" and its_what == "name":
            warnings.append(
                f"name {p.name!r} is the shipped {s.kind} profile's ({s.full_name}): this file "
                f"would be taken for it (results read as the shipped {s.name}, and the two "
                f"cannot share a profiles folder); give it a name of its own")
        else:
            its = f" ({its_what} {its_text!r})" if its_text != text or its_what != what else ""
            warnings.append(
                f"{what} {text!r} is also the shipped {s.kind} profile {s.name}'s{its}: a "
                f"lookup by it would find the shipped one, and the two cannot share a profiles "
                f"folder; choose another")
    return warnings


def _source_key_warnings(p: HardwareProfile) -> list[str]:
    """Sources keyed by no figure of ``p`` (a misspelt field), with the closest figure."""
    fields: dict[str, Any] = {name: getattr(p, name) for name in type(p).model_fields}
    figures = list(fields) + [f"{name}.{key}" for name, value in fields.items()
                              if isinstance(value, dict) for key in value]
    warnings = []
    for key in p.sources:
        why = source_key_problem(type(p), fields, key)
        if why:
            close = difflib.get_close_matches(key, figures, n=1)
            hint = f"; did you mean sources.{close[0]}?" if close else ""
            warnings.append(f"sources.{key} names no figure ({why}){hint}")
    return warnings


# -- numbers ---------------------------------------------------------------------------------


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def _quantity(x: float, unit: str) -> str:
    return f"{_num(x)} {unit}" if unit else _num(x)
