"""Schemas of hardware profiles: devices (GPUs and CPUs), links, systems and prices.

Profiles are data: one YAML file per item under ``hardware_profiles/``. Every figure a file
states must name its source in ``sources`` (keyed by field name, or ``field.key`` for one entry
of a per-precision table), so a datasheet number can always be traced. Fitted efficiencies
never live here; they live in calibration files (see ``gpusim.hardware.calibration``).

Units are in the key names; the properties at the bottom of each class convert to SI.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticUndefined

from gpusim import units

Precision = Literal["fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8"]
PRECISIONS: tuple[Precision, ...] = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")

Positive = Annotated[float, Field(gt=0)]
PositiveInt = Annotated[int, Field(gt=0, strict=True)]
NonNegative = Annotated[float, Field(ge=0)]
_NAME = re.compile(r"^[a-z0-9][a-z0-9.+-]*$")
_DATE = re.compile(r"^\d{4}-\d{2}(-\d{2})?$")


# Fields that describe rather than measure need no source.
_UNSOURCED = frozenset(
    {"kind", "name", "full_name", "aliases", "sources", "notes", "vendor", "architecture",
     "cloud_prices", "street_prices", "family", "generation", "gpu", "cpu", "intra_node_link",
     "inter_node_link", "host_link", "intra_node_topology"}
)


class Frozen(BaseModel):
    """Base of every record: immutable, and unknown keys are errors (catches typos in files)."""

    # Numbers must be finite (.inf and 1e309 are typing slips) and counts real integers
    # (true is not 1 SM).
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=False)


class PriceQuote(Frozen):
    """An on-demand cloud price for one device, as a provider listed it on a date: per
    device-hour, from an instance of ``instance_gpus`` devices (1: a single-card rental;
    8: an 8-GPU server, the unit large jobs rent)."""

    usd_per_hour: Positive
    provider: str
    instance_gpus: int = Field(default=1, ge=1)
    date: str = Field(description="YYYY-MM or YYYY-MM-DD")
    source: str

    @model_validator(mode="after")
    def _date_format(self) -> PriceQuote:
        if not _DATE.match(self.date):
            raise ValueError(f"date {self.date!r} must be YYYY-MM or YYYY-MM-DD")
        return self


class PurchaseQuote(Frozen):
    """What one device cost to buy (new, one unit), as a seller or report listed it on a date."""

    usd: Positive
    seller: str
    date: str | None = Field(description="YYYY-MM or YYYY-MM-DD; None when not stated")
    source: str

    @model_validator(mode="after")
    def _date_format(self) -> PurchaseQuote:
        if self.date is not None and not _DATE.match(self.date):
            raise ValueError(f"date {self.date!r} must be YYYY-MM or YYYY-MM-DD")
        return self


class Profile(Frozen):
    """Fields every profile shares: a short name, a long name, aliases and sources."""

    name: str = Field(description="short lowercase name, also the file name")
    full_name: str
    aliases: list[str] = []
    sources: dict[str, str] = Field(
        default_factory=dict, description="field (or field.key) -> where the figure comes from"
    )
    notes: str = ""

    @model_validator(mode="after")
    def _check_name_and_sources(self) -> Profile:
        problems = []  # both rules' problems in one run
        if not _NAME.match(self.name):
            problems.append(
                f"name {self.name!r} must be lowercase letters, digits, '.', '+' or '-'"
            )
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        unsourced = unsourced_problem(type(self), fields, self.sources)
        if unsourced:
            problems.append(unsourced)
        if problems:
            raise ValueError("; ".join(problems))
        return self


def unsourced_problem(cls: type[Profile], data: Mapping[str, Any],
                      sources: Mapping[str, Any]) -> str | None:
    """Every figure of ``data`` (a profile's fields, or a file's mapping, whose missing fields
    take their defaults) without a source, named at once; None when each has one. A source
    keyed by no field that is close to a missing one is named as the likely misspelling."""
    missing = []
    for field_name, field in cls.model_fields.items():
        if field_name in _UNSOURCED:
            continue
        value = data[field_name] if field_name in data else field.get_default(
            call_default_factory=True)
        if value is None or value is PydanticUndefined:
            continue
        if isinstance(value, dict):
            missing += [f"{field_name}.{key}" for key in value
                        if field_name not in sources
                        and f"{field_name}.{key}" not in sources]
        elif field_name not in sources:
            missing.append(field_name)
    if not missing:
        return None
    slips = []  # sources.memory_bandwith_gb_s leaves memory_bandwidth_gb_s unsourced
    for key in sources:
        why = source_key_problem(cls, data, str(key))
        close = difflib.get_close_matches(str(key), missing, n=1) if why else []
        if close:
            slips.append(f"sources.{key} names no figure ({why}): did you mean "
                         f"sources.{close[0]}?")
    return (f"{len(missing)} field{'s' if len(missing) > 1 else ''} without "
            f"a source: {', '.join(missing)}; add sources.<field> for each "
            f"(or sources.<field>.<key> for one entry of a table)"
            + "".join(f"; {slip}" for slip in slips))


def source_key_problem(cls: type[Profile], data: Mapping[str, Any], key: str) -> str | None:
    """Why ``sources.<key>`` names no figure of a ``cls`` profile with fields ``data`` (no
    such field, or no such entry of its table), or None when it names one."""
    field_name, dot, entry = key.partition(".")
    if field_name not in cls.model_fields:
        kind = cls.model_fields.get("kind")
        return f"a {kind.default if kind else 'hardware'} profile has no field {field_name}"
    table = data.get(field_name)
    if dot and isinstance(table, dict) and entry not in table:
        return f"{field_name} has no entry {entry}"
    return None


class DeviceProfile(Profile):
    """What the cost model needs of any device that trains: GPU or CPU.

    ``matrix_tflops`` are dense peaks of matrix units (tensor cores, AMX); ``vector_tflops``
    dense peaks of the ordinary cores (CUDA cores, SIMD lanes). Sparse figures are never used.
    """

    vendor: str
    architecture: str
    compute_units: PositiveInt = Field(description="SMs, CUs or CPU cores")
    boost_clock_mhz: Positive
    base_clock_mhz: Positive | None = None
    vector_tflops: dict[Precision, Positive]
    matrix_tflops: dict[Precision, Positive] = {}
    memory_gib: Positive
    memory_bandwidth_gb_s: Positive
    tdp_w: Positive
    power_limit_w: Positive | None = Field(
        None, description="the board power limit it runs under when below its TDP (the "
                          "SKU's default, or nvidia-smi -pl); none: its TDP")
    sustained_clock_mhz: Positive | None = Field(
        None, description="the clock its compute units settle at under a sustained load, "
                          "held there by the board's power limit, as measured (nvidia-smi "
                          "under load); compute-bound kernels run at this clock's share of "
                          "the boost clock's peak where no power calibration of the "
                          "architecture says more. None: the boost clock")
    launch_price_usd: Positive | None = None
    launch_date: str | None = None
    cloud_prices: list[PriceQuote] = []
    street_prices: list[PurchaseQuote] = Field(
        default=[], description="what one unit sold for after launch, dated")

    @model_validator(mode="after")
    def _check_device(self) -> DeviceProfile:
        if "fp32" not in self.vector_tflops:
            raise ValueError("vector_tflops must state fp32")
        if self.base_clock_mhz is not None and self.base_clock_mhz > self.boost_clock_mhz:
            raise ValueError(
                f"base_clock_mhz {self.base_clock_mhz} exceeds boost_clock_mhz "
                f"{self.boost_clock_mhz}"
            )
        if self.sustained_clock_mhz is not None and \
                self.sustained_clock_mhz > self.boost_clock_mhz:
            raise ValueError(f"sustained_clock_mhz {self.sustained_clock_mhz} exceeds "
                             f"boost_clock_mhz {self.boost_clock_mhz}")
        if self.power_limit_w is not None and self.power_limit_w > self.tdp_w:
            raise ValueError(f"power_limit_w {self.power_limit_w} exceeds tdp_w {self.tdp_w}: "
                             "a board cannot be set above its TDP")
        if self.launch_date is not None and not _DATE.match(self.launch_date):
            raise ValueError(f"launch_date {self.launch_date!r} must be YYYY-MM or YYYY-MM-DD")
        return self

    @property
    def memory_bytes(self) -> float:
        return units.gib(self.memory_gib)

    @property
    def usable_memory_bytes(self) -> float:
        """What a process can allocate of ``memory_bytes`` (all of it on a CPU)."""
        return self.memory_bytes

    @property
    def memory_bandwidth(self) -> float:
        """Peak memory bandwidth, bytes/s."""
        return units.gb_s(self.memory_bandwidth_gb_s)

    @property
    def tdp(self) -> float:
        """Board power in watts."""
        return self.tdp_w

    @property
    def power_limit(self) -> float:
        """The board power limit it runs under, watts: its set limit, else its TDP."""
        return self.power_limit_w or self.tdp_w

    @property
    def is_gpu(self) -> bool:
        return False

    def peak_flops(self, precision: Precision, *, matrix: bool) -> tuple[float, str]:
        """The peak FLOP/s this device reaches for ``precision`` and which unit gives it.

        Matrix work uses the matrix units when they support the precision; otherwise it falls
        back to the vector units at the best precision they run (fp16 on a GPU without fp16
        math runs at fp32 rate, as frameworks do).
        """
        if matrix and precision in self.matrix_tflops:
            return units.tflops(self.matrix_tflops[precision]), "matrix"
        for candidate in _VECTOR_FALLBACK[precision]:
            if candidate in self.vector_tflops:
                return units.tflops(self.vector_tflops[candidate]), "vector"
        return units.tflops(self.vector_tflops["fp32"]), "vector"

    def cloud_price_usd_per_hour(self, num_devices: int = 1) -> PriceQuote | None:
        """The lowest listed on-demand price per device-hour for a job of ``num_devices``:
        the instances that job would rent (whole servers once it fills one, since a
        single-card marketplace rate does not scale to a cluster), else the lowest of any
        size; None when no provider lists one."""
        if not self.cloud_prices:
            return None
        servers = [q for q in self.cloud_prices
                   if q.instance_gpus > 1 and num_devices >= q.instance_gpus]
        return min(servers or self.cloud_prices, key=lambda q: q.usd_per_hour)

    def purchase_price(self) -> PurchaseQuote | None:
        """What one unit costs to buy: the newest street price, else the launch price."""
        if self.street_prices:
            return max(self.street_prices, key=lambda q: q.date or "")
        if self.launch_price_usd is None:
            return None
        return PurchaseQuote(usd=self.launch_price_usd, seller="launch price",
                             date=self.launch_date,
                             source=self.sources.get("launch_price_usd", ""))


# Which vector rate a precision runs at when no matrix unit takes it (tf32 is a matrix-unit
# format; on vector units the work happens in fp32).
_VECTOR_FALLBACK: dict[str, tuple[str, ...]] = {
    "fp64": ("fp64",),
    "fp32": ("fp32",),
    "tf32": ("fp32",),
    "fp16": ("fp16", "fp32"),
    "bf16": ("bf16", "fp16", "fp32"),
    "fp8": ("fp8", "fp16", "fp32"),
    "int8": ("int8", "fp32"),
}


class GPUProfile(DeviceProfile):
    """A GPU or accelerator board, from its datasheet and whitepaper."""

    kind: Literal["gpu"] = "gpu"
    cuda_cores: PositiveInt | None = Field(None, description="FP32 lanes (stream processors)")
    tensor_cores: PositiveInt | None = None
    l2_cache_mib: Positive | None = None
    pcie_gen: Annotated[int, Field(ge=1, le=6)]
    nvlink_bandwidth_gb_s: Positive | None = Field(
        None, description="total NVLink/Infinity Fabric bandwidth per GPU, both directions"
    )
    nvlink_generation: Annotated[int, Field(ge=1, le=6)] | None = None
    fp32_lanes_shared_with_int32: bool | None = Field(
        None, description="whether half its SMs' FP32 lanes also run INT32 work (Ampere "
                          "GA10x, Ada AD10x), so fp32 matrix products reach less of the "
                          "FP32 peak that counts them all (gpusim.cost.shared_lanes); none: "
                          "not stated, taken as no")
    driver_reserved_mib: NonNegative | None = Field(
        None, description="of memory_gib, what no process can allocate (the driver's, ECC's "
                          "and firmware's reserve): memory_gib less what "
                          "torch.cuda.get_device_properties().total_memory reports, MiB; "
                          "none: not known, taken as 0")

    @property
    def is_gpu(self) -> bool:
        return True

    @property
    def usable_memory_bytes(self) -> float:
        """What a process can allocate: torch.cuda.get_device_properties().total_memory
        (nothing when a what-if memory_gib is below the reserve)."""
        return max(0.0, self.memory_bytes - units.mib(self.driver_reserved_mib or 0.0))

    @property
    def l2_bytes(self) -> float:
        return units.mib(self.l2_cache_mib) if self.l2_cache_mib else 0.0


class CPUProfile(DeviceProfile):
    """A CPU package as a training device: cores, clock, SIMD width and memory system.

    ``memory_gib`` is the memory of the configuration the profile describes (a CPU has no fixed
    memory size); ``compute_units`` counts physical cores.
    """

    kind: Literal["cpu"] = "cpu"
    threads: PositiveInt
    simd_width_bits: Literal[128, 256, 512]
    fma_units_per_core: PositiveInt
    memory_channels: PositiveInt | None = None
    l3_cache_mib: Positive | None = None

    @model_validator(mode="after")
    def _check_fp32_peak(self) -> CPUProfile:
        # Peak = cores x clock x lanes x 2 (FMA) x FMA units; a stated figure far from that is a
        # typo (allow for the lower all-core AVX clocks vendors use).
        lanes = self.simd_width_bits // 32
        derived = (
            self.compute_units * self.boost_clock_mhz * 1e6 * lanes * 2 * self.fma_units_per_core
        )
        stated = units.tflops(self.vector_tflops["fp32"])
        if not 0.3 * derived <= stated <= 1.05 * derived:
            raise ValueError(
                f"vector_tflops.fp32 {self.vector_tflops['fp32']} is inconsistent with cores x "
                f"clock x SIMD lanes x 2 x FMA units = {derived / 1e12:.2f} TFLOP/s"
            )
        return self


class LinkProfile(Profile):
    """One kind of link: a PCIe x16 slot, one NVLink link, one InfiniBand port, one NIC."""

    kind: Literal["link"] = "link"
    family: Literal["pcie", "nvlink", "infinity-fabric", "infiniband", "ethernet"]
    generation: str
    bandwidth_gb_s: Positive = Field(description="per direction, per link or port")
    latency_us: Positive

    @property
    def bandwidth(self) -> float:
        """Bytes/s per direction."""
        return units.gb_s(self.bandwidth_gb_s)

    @property
    def latency(self) -> float:
        return units.us(self.latency_us)


class SystemProfile(Profile):
    """A node design: GPUs, how they are joined inside the node, and how nodes are joined."""

    kind: Literal["system"] = "system"
    gpu: str
    gpus_per_node: PositiveInt
    cpu: str | None = None
    cpus_per_node: Annotated[int, Field(ge=0)] = 0
    host_link: str = Field(description="link between host and each GPU (a PCIe profile)")
    intra_node_link: str = Field(description="GPU-to-GPU link inside the node")
    intra_node_links_per_gpu: PositiveInt = 1
    intra_node_topology: Literal["nvswitch", "hybrid-cube-mesh", "pcie-switch", "full-mesh"]
    inter_node_link: str | None = None
    nics_per_node: Annotated[int, Field(ge=0)] = 0
    host_memory_gib: Positive | None = None
    power_w: Positive | None = None
    launch_price_usd: Positive | None = None


HardwareProfile = GPUProfile | CPUProfile | LinkProfile | SystemProfile
