"""Calibration: fitted (or stated default) efficiencies, kept apart from datasheet figures.

A calibration file says how close real kernels come to a device's datasheet peaks: the
largest fraction of peak a matrix product reaches per precision, a ramp time that makes small
kernels less efficient (the saturating curve), tile shapes for quantization, achieved memory
bandwidth, and the fixed costs of a kernel on the device and of dispatching it from the host.

Lookup order for a device: a file whose ``device`` names it, else the file for its
``architecture``. A file's ``status`` is ``default`` (stated, not fitted, with its reasoning)
until ``gpusim calibrate`` replaces it with one ``fitted`` on named microbenchmarks.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, TypeVar

from pydantic import Field, ValidationError, model_validator

from gpusim.errors import InvalidProfile
from gpusim.hardware.catalog import format_validation_error, profiles_dir, read_yaml
from gpusim.hardware.power import PowerCalibration, power_calibration_for
from gpusim.hardware.profile import DeviceProfile, Frozen

Fraction = Annotated[float, Field(gt=0, le=1)]
NonNegative = Annotated[float, Field(ge=0)]


# The kernel family of a norm written as separate ops that upcast (workload.layers.Elementwise)
UPCAST_SUFFIX = "_upcast"
# The kernel family of TorchInductor's kernel for a norm or activation (plan.lower.as_compiled)
COMPILED_SUFFIX = "_compiled"


def compiled_family(family: str) -> str:
    """The family of the kernel TorchInductor generates for an eager kernel of ``family``;
    a plain pass (no family) stays plain."""
    return family.removesuffix(UPCAST_SUFFIX) + COMPILED_SUFFIX if family else ""


class Tile(Frozen):
    """A GEMM tile a library may pick; ``efficiency`` is its throughput relative to the best."""

    m: Annotated[int, Field(gt=0)]
    n: Annotated[int, Field(gt=0)]
    efficiency: Fraction = 1.0


class GemmCalibration(Frozen):
    max_efficiency: dict[str, Fraction] = Field(
        description="largest fraction of the datasheet peak reached, per math precision"
    )
    ramp_us: NonNegative = Field(
        description="fixed time a matrix kernel loses to filling and draining its pipeline"
    )
    tiles: list[Tile] = Field(default_factory=list, description="empty: no tile quantization")
    ctas_per_sm: Annotated[int, Field(gt=0)] = 1
    conv_factor: Fraction = Field(1.0, description="cuDNN convolutions relative to GEMM")
    conv_factors: dict[str, Fraction] = Field(
        default_factory=dict,
        description="per math precision, overriding conv_factor: cuDNN's NCHW convolutions "
                    "reach about the same FLOP rate in TF32 and in bf16 on Hopper, so one "
                    "factor over both precisions' GEMM peaks cannot fit both")
    attention_factor: Fraction = Field(1.0, description="fused attention relative to GEMM")
    attention_backward_factor: Fraction | None = Field(
        None, description="fused attention's backward relative to GEMM (none: "
                          "attention_factor); its five products and the recomputed softmax "
                          "reach less of the peak than the forward's two")
    layout_factors: dict[Literal["nt", "tn"], Fraction] = Field(
        default_factory=dict,
        description="a matrix product's efficiency by operand layout, relative to the "
                    "row-major products (nn) max_efficiency is fitted on: a linear layer's "
                    "forward (nt) and weight gradient (tn), fitted on the micro suite's "
                    "linear cases; none given: 1")
    attention_kernels: dict[str, dict[Literal["forward", "backward"], Fraction]] = Field(
        default_factory=dict,
        description="per named attention kernel (flash2, cudnn, efficient, ...), its forward "
                    "and backward relative to GEMM, fitted on SDPA restricted to that "
                    "backend; a kernel not listed runs as attention_factor says (the "
                    "architecture's default kernel)")
    attention_tile_overhead: dict[str, NonNegative] = Field(
        default_factory=dict,
        description="per attention kernel (flash2, cudnn, ...; auto: the architecture's "
                    "default kernel), the fixed work each block of queries costs beyond its "
                    "blocks of keys, in key blocks (loading the queries, the softmax's final "
                    "rescale, writing the output): a kernel whose query blocks each see few "
                    "keys (short sequences) runs below the rate long ones reach, by keys / "
                    "(keys + overhead), relative to its factor's rate at 32 key blocks "
                    "(cost.kernels.REFERENCE_KEY_BLOCKS). Fitted where a kernel's cases span "
                    "sequence lengths; none given: the default kernel's, else 0")
    attention_longest: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict,
        description="per attention kernel (as attention_tile_overhead), the most key blocks "
                    "per query block among the cases its overhead was fitted on: a longer "
                    "sequence runs at that length's rate, since the fitted curve is not "
                    "carried past the measurements (published long-sequence figures level "
                    "off or fall: the FlashAttention-3 paper's cuDNN rows on an H100 at 16K, "
                    "cuDNN on a B200 past 32K)")
    attention_widest: dict[str, Annotated[int, Field(gt=0)]] = Field(
        default_factory=dict,
        description="per attention kernel (as attention_softmax_width), the largest head "
                    "dimension among the cases its softmax width was fitted on: a wider head "
                    "runs at that dimension's rate (the FlashAttention-3 paper's head-dim-256 "
                    "rows on an H100 run below the curve's extrapolation)")
    attention_softmax_width: dict[str, NonNegative] = Field(
        default_factory=dict,
        description="per attention kernel (as attention_tile_overhead), the work of the "
                    "softmax on each block of scores in head-dimension units: the two "
                    "products grow with the head dimension d and the softmax does not, so "
                    "a kernel runs at d / (d + width) of its rate, relative to its factor's "
                    "at d = 128 (FlashAttention's head-dim-64 runs below its 128 ones). "
                    "Fitted where a kernel's cases span head dimensions; none given: the "
                    "default kernel's, else 0")
    long_k_slope: dict[str, NonNegative] = Field(
        default_factory=dict,
        description="per math precision, how a product's rate falls as its inner dimension K "
                    "grows past long_k_knee: efficiency x (long_k_knee / K) ** slope. A longer "
                    "K keeps the tensor cores busier per output tile, so a board at its power "
                    "limit holds a lower clock (the H100 micro suite: bf16 products with K of "
                    "8192 and more ran 5-8% below those with K 4096; Bekman's sustained H200 "
                    "K walk, measurements/published/power_limits.yaml, the same way). Fitted "
                    "where the micro suite spans the knee; none given: no fall")
    long_k_knee: Annotated[int, Field(gt=0)] = Field(
        4096, description="K up to which a product runs at max_efficiency")
    epilogue_exposed: Annotated[float, Field(ge=0, le=1)] = Field(
        0.0, description="how much of a matrix product's result write (M x N) fails to "
                         "overlap its main loop: a CTA writes its output tile after its last "
                         "K step, so the product takes the roofline's max(compute, memory) "
                         "plus this share of the shorter of its compute and its write. A "
                         "short K (a row-parallel linear under tensor parallelism, an MoE "
                         "expert's down projection) writes about as long as it computes (the "
                         "H100 micro suite: 2048x16384x256 bf16 in 39 us, where the math "
                         "takes 21 and the write 23). Fitted where the micro suite has such "
                         "products; none given: 0, the plain roofline")
    misaligned_factor: dict[str, Fraction] = Field(
        default_factory=dict,
        description="per math precision, a matrix product's efficiency relative to "
                    "max_efficiency when a stored row is not a multiple of 16 bytes (e.g. "
                    "GPT-2's 50257-word vocabulary); none given: no penalty")
    thin_efficiency: dict[str, Fraction] = Field(
        default_factory=dict,
        description="per math precision, the tile efficiency of a thin product, one with "
                    "fewer rows or columns than the smallest tile (a batch of 16 tokens, a "
                    "LoRA rank, a router's 8 experts): libraries run those as GEMV-like or "
                    "thin-tiled split-K kernels, not as padded tiles; fitted on thin micro "
                    "cases; none given: the tiles' padding and waves as for any product")
    sustained_factor: Fraction = Field(
        1.0, description="a tensor-core product's rate when products run back to back for "
                         "seconds, as a training step runs them, over its rate in the micro "
                         "suite's short bursts, which max_efficiency is fitted on: the SM "
                         "clock settles to what the power limit allows (the H100's sustained "
                         "8192^3 bf16 product: 1.62 ms a call against 1.54 in bursts, its "
                         "clock 1980 -> ~1370 MHz at 700 W). Fitted from the micro suite's "
                         "sustained_gemm case; none: 1")


class MemoryCalibration(Frozen):
    max_efficiency: Fraction = Field(description="achieved fraction of peak memory bandwidth")
    ramp_us: NonNegative = Field(description="fixed time a memory-bound kernel loses")
    first_touch_gb_s: Annotated[float, Field(gt=0)] | None = Field(
        None, description="CPUs: rate the OS maps the fresh pages of a large new allocation "
                          "(none on GPUs, whose caching allocator reuses memory)")
    kernel_factors: dict[str, Fraction] = Field(
        default_factory=dict,
        description="per kernel family (batch_norm, batch_norm_native, ...), the bandwidth "
                    "its kernels reach relative to max_efficiency; none given: 1")
    first_touch_min_mib: NonNegative = Field(
        32.0, description="allocations at least this large come fresh from the OS (glibc's "
                          "largest mmap threshold on 64-bit, 32 MiB: mallopt(3))")

    def kernel_factor(self, family: str) -> float:
        """The factor of a kernel family. A norm written as separate upcasting ops
        (``<op>_upcast``) and its one fused kernel stand for each other until both are
        measured; TorchInductor's kernel (``<op>_compiled``) takes the fused kernel's factor
        until it is measured; any other family not measured runs at max_efficiency (1)."""
        factors = self.kernel_factors
        if family in factors:
            return factors[family]
        if family.endswith(COMPILED_SUFFIX):
            return self.kernel_factor(family.removesuffix(COMPILED_SUFFIX))
        sibling = (family.removesuffix(UPCAST_SUFFIX) if family.endswith(UPCAST_SUFFIX)
                   else family + UPCAST_SUFFIX)
        return factors.get(sibling, 1.0) if family else 1.0
    cache_mib: Annotated[float, Field(gt=0)] | None = Field(
        None, description="CPUs: a memory-bound op that moves at most this many MiB runs out "
                          "of the caches, at cache_efficiency; a larger one streams from DRAM "
                          "at max_efficiency (none: one rate for every size, as on GPUs)")
    cache_efficiency: Annotated[float, Field(gt=0)] | None = Field(
        None, description="CPUs: achieved bandwidth of cache-sized ops, as a fraction of "
                          "peak DRAM bandwidth (may exceed 1)")


class OverheadCalibration(Frozen):
    kernel_us: NonNegative = Field(description="device-side gap per kernel")
    launch_us: NonNegative = Field(description="host time to launch one kernel")
    dispatch_us: NonNegative = Field(description="framework (PyTorch eager) host time per op")
    autograd_us: NonNegative = Field(
        0.0, description="extra host time per op of a training pass: recording an autograd "
                         "node in forward, running it in backward (not the optimizer)")
    module_us: NonNegative = Field(
        0.0, description="Python host time of calling one layer (an nn.Module), beyond its ops")
    backward_call_us: NonNegative = Field(
        0.0, description="host time of one backward() call, beyond its nodes")
    layer_us: dict[str, NonNegative] = Field(
        default_factory=dict,
        description="per layer kind (linear, conv, layer_norm, ...), host time of calling "
                    "one such layer in forward beyond module_us and its kernels' dispatch: "
                    "the ops that launch nothing (views, transposes, autocast's checks) and "
                    "Python")
    layer_backward_us: dict[str, NonNegative] = Field(
        default_factory=dict,
        description="per layer kind, host time of the layer's autograd nodes in backward "
                    "beyond its kernels' dispatch")
    optimizer_us: NonNegative = Field(
        0.0, description="host time of a torch.optim step() call beyond its kernels")
    optimizer_tensor_us: NonNegative = Field(
        0.0, description="host time of a torch.optim step() per parameter tensor")
    cublas_us: NonNegative = Field(
        0.0, description="extra host time of one cuBLAS matrix product (algorithm choice "
                         "and launch through cuBLASLt), beyond a plain op's dispatch")
    scaled_mm_us: NonNegative = Field(
        0.0, description="extra host time of one fp8 matrix product (torch._scaled_mm: its "
                         "scale operands checked and set on the cuBLASLt descriptor), beyond "
                         "cublas_us")
    cudnn_us: NonNegative = Field(
        0.0, description="extra host time of one cuDNN call (a convolution, or batch norm "
                         "on fp32): plan lookup and launch through cuDNN, beyond a plain "
                         "op's dispatch")


    def layer_call_us(self, kind: str, phase: str) -> float:
        """Host microseconds of running one layer of ``kind`` in ``phase``, beyond its
        kernels: the module call and its launch-free ops in forward (and recompute), its
        autograd nodes in backward."""
        if phase == "backward":
            return self.layer_backward_us.get(kind, 0.0)
        return self.module_us + self.layer_us.get(kind, 0.0)


class Calibration(Frozen):
    """Efficiencies of one device or architecture."""

    kind: Literal["calibration"] = "calibration"
    name: str
    architecture: str | None = None
    device: str | None = None
    status: Literal["default", "fitted"]
    fitted_on: list[str] = Field(default_factory=list, description="measurement files used")
    bounded_by: list[str] = Field(
        default_factory=list,
        description="micro files whose searched maxima (GEMM rows marked fit: false, the "
                    "fastest a search over shapes found) bound the fit: no shape is predicted "
                    "faster; nothing else in them is fitted")
    rationale: str = ""
    gemm: GemmCalibration
    memory: MemoryCalibration
    overhead: OverheadCalibration
    host_overhead_from: str | None = Field(
        None, description="an architecture whose calibration's host-side overheads (all of "
                          "overhead but kernel_us) this one uses: they are costs of the host "
                          "CPU and of PyTorch, measured once on one machine, not of this GPU")
    idle_power_fraction: Fraction = Field(
        description="board power when idle, as a fraction of TDP"
    )
    pcie_efficiency: Fraction = 0.8
    power: PowerCalibration | None = Field(
        None, description="how the architecture's matrix throughput falls under a power "
                          "limit: attached from calibration/power/<architecture>.yaml, never "
                          "written into this file")

    @model_validator(mode="after")
    def _check(self) -> Calibration:
        if (self.architecture is None) == (self.device is None):
            raise ValueError("give exactly one of architecture or device")
        if self.status == "fitted" and not self.fitted_on:
            raise ValueError("a fitted calibration must name the measurements in fitted_on")
        return self

    def attention_efficiency(self, kernel: str, backward: bool) -> float:
        """Fused attention's fraction of the GEMM efficiency: the named kernel's where
        fitted, else the default kernel's."""
        g = self.gemm
        named = g.attention_kernels.get(kernel, {}).get("backward" if backward else "forward")
        if named is not None:
            return named
        if backward and g.attention_backward_factor is not None:
            return g.attention_backward_factor
        return g.attention_factor

    def attention_overhead(self, kernel: str) -> float:
        """Key blocks of fixed work per query block: the named kernel's where fitted, else
        the default kernel's (auto), else none."""
        return _for_kernel(self.gemm.attention_tile_overhead, kernel) or 0.0

    def attention_width(self, kernel: str) -> float:
        """The softmax's head-dimension units per score block, as attention_overhead."""
        return _for_kernel(self.gemm.attention_softmax_width, kernel) or 0.0

    def attention_longest(self, kernel: str) -> float | None:
        """Key blocks per query block past which the overhead's curve is held flat."""
        return _for_kernel(self.gemm.attention_longest, kernel)

    def attention_widest(self, kernel: str) -> int | None:
        """The head dimension past which the softmax's term is held flat."""
        return _for_kernel(self.gemm.attention_widest, kernel)

    def gemm_efficiency(self, math: str) -> float:
        """Max efficiency for ``math``; precisions the file omits use its fp32 entry."""
        return self.gemm.max_efficiency.get(math, self.gemm.max_efficiency.get("fp32", 0.7))

    def sustained(self) -> Calibration:
        """This calibration as a training step runs: its tensor-core precisions'
        max_efficiency times gemm.sustained_factor (a step's products run for seconds, at
        the clock the power limit allows). The copy's factor is 1, so a second call changes
        nothing; the micro suite's bursts keep the calibration as fitted."""
        factor = self.gemm.sustained_factor
        if factor == 1.0:
            return self
        key = id(self)
        if key not in _SUSTAINED:
            eff = {m: e * factor if m in TENSOR_CORE_PRECISIONS else e
                   for m, e in self.gemm.max_efficiency.items()}
            gemm = self.gemm.model_copy(update={"max_efficiency": eff, "sustained_factor": 1.0})
            _SUSTAINED[key] = (self, self.model_copy(update={"gemm": gemm}))
        return _SUSTAINED[key][1]


T = TypeVar("T")

# GemmCalibration's per-kernel shape terms of fused attention, each keyed by kernel name
# ("auto": the architecture's default kernel).
ATTENTION_SHAPE_TERMS = ("attention_tile_overhead", "attention_softmax_width",
                         "attention_longest", "attention_widest")


def _for_kernel(found: Mapping[str, T], kernel: str) -> T | None:
    """A per-kernel term: the named kernel's, else the default kernel's, else none."""
    return found.get(kernel or "auto", found.get("auto"))


def load_calibration_file(path: str | Path) -> Calibration:
    path = Path(path)
    data = read_yaml(path)
    try:
        return Calibration.model_validate(data)
    except ValidationError as exc:
        raise InvalidProfile(format_validation_error(str(path), exc, Calibration)) from exc


@lru_cache(maxsize=4)
def _all(root: str) -> tuple[Calibration, ...]:
    folder = Path(root) / "calibration"
    return tuple(load_calibration_file(p) for p in sorted(folder.glob("*.yaml")))


def stated_defaults(device: DeviceProfile) -> Calibration:
    """The stated (not fitted) calibration of ``device``'s architecture, where a fit starts:
    ``calibration/defaults/<architecture>.yaml`` once a fit has replaced the architecture's
    own file, else the file in use."""
    kept = profiles_dir() / "calibration" / "defaults" / f"{device.architecture}.yaml"
    return load_calibration_file(kept) if kept.exists() else calibration_for(device, own=False)


def calibration_for(device: DeviceProfile, own: bool = True) -> Calibration:
    """The calibration of ``device``: its own fitted file (unless ``own`` is False), else its
    architecture's; host-side overheads from the architecture it names for them, if any."""
    cal = _calibration_file_for(device, own)
    if cal.host_overhead_from is not None:
        cal = _with_host_overheads(str(profiles_dir()), cal.name)
    return _with_power(cal, power_calibration_for(device))


# The precisions matrix (tensor) cores run, whose products slow to the power limit's clock
# when sustained (GemmCalibration.sustained_factor); fp32 and fp64 run on the SIMT units.
TENSOR_CORE_PRECISIONS = frozenset({"tf32", "fp16", "bf16", "fp8", "int8"})
# Calibration.sustained's copies, keyed by the source's identity (kept, so never reused).
_SUSTAINED: dict[int, tuple[Calibration, Calibration]] = {}

# Keyed by identity; each entry holds its two sources, so their ids are never reused.
_WITH_POWER: dict[tuple[int, int], tuple[Calibration, PowerCalibration, Calibration]] = {}


def _with_power(cal: Calibration, power: PowerCalibration | None) -> Calibration:
    """``cal`` with ``power`` attached (once per pair of cached files: searches ask for a
    device's calibration per job)."""
    if power is None:
        return cal
    key = (id(cal), id(power))
    if key not in _WITH_POWER:
        _WITH_POWER[key] = (cal, power, cal.model_copy(update={"power": power}))
    return _WITH_POWER[key][2]


@lru_cache(maxsize=16)
def _with_host_overheads(root: str, name: str) -> Calibration:
    """Calibration ``name`` with the host-side overheads of the architecture it names (once
    per file: searches and sweeps ask for a device's calibration per job)."""
    found = _all(root)
    cal = next(c for c in found if c.name == name)
    source = next((c for c in found if c.architecture == cal.host_overhead_from), None)
    if source is None:
        raise InvalidProfile(f"calibration {cal.name} takes its host overheads from "
                             f"{cal.host_overhead_from!r}, which has no calibration file")
    host = source.overhead.model_copy(update={"kernel_us": cal.overhead.kernel_us})
    return cal.model_copy(update={"overhead": host})


def _calibration_file_for(device: DeviceProfile, own: bool) -> Calibration:
    found = _all(str(profiles_dir()))
    for cal in found:
        if own and cal.device == device.name:
            return cal
    for cal in found:
        if cal.architecture == device.architecture:
            return cal
    fallback = "cpu" if not device.is_gpu else "gpu"
    for cal in found:
        if cal.architecture == fallback:
            return cal
    raise InvalidProfile(
        f"no calibration for {device.name} (architecture {device.architecture}) and no "
        f"generic {fallback!r} file in hardware_profiles/calibration/"
    )
