"""Kernel costs: pure functions from (op, device, calibration) to seconds.

One roofline for every op: time is the larger of compute time (FLOPs over the peak of the
unit the precision uses, times an efficiency) and memory time (bytes over achieved
bandwidth), plus a ramp (pipeline fill and drain, which makes small kernels inefficient: the
saturating curve) and a fixed per-kernel gap. Matrix products and convolutions on a GPU are
also quantized: M and N round up to the tile, tiles round up to whole waves over the SMs,
and a product's result is written after its main loop, so part of that write adds to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from gpusim import units
from gpusim.cost.shared_lanes import shared_lane_factor, shares_fp32_lanes
from gpusim.hardware.calibration import Calibration
from gpusim.hardware.power import compute_rate_factor
from gpusim.hardware.profile import DeviceProfile, GPUProfile
from gpusim.workload.ops import DTYPE_BYTES, AttentionShape, GemmShape, Op

# Shortest K slice a split-K GEMM gives one CTA (shorter slices spend more time reducing).
SPLIT_K_MIN = 256


@dataclass(frozen=True, slots=True)
class KernelCost:
    """Seconds one op takes on the device, and why."""

    seconds: float
    compute_s: float
    memory_s: float
    bound: Literal["compute", "memory"]
    unit: str  # "matrix" (tensor cores, AMX) or "vector"
    efficiency: float  # achieved fraction of the unit's peak, ramp and overhead included
    exposed_write_s: float = 0.0  # a product's result write its main loop does not hide


def quantization_efficiency(shape: GemmShape, device: GPUProfile, cal: Calibration,
                            precision: str = "") -> float:
    """Best tile/wave efficiency over the tiles a library may pick (1.0 when no tiles); for
    a product thinner than the smallest tile, the fitted thin efficiency of its math
    ``precision`` where the calibration has one.

    Tile efficiency: useful M x N over M x N rounded up to the tile. Wave efficiency: tiles
    over whole waves of (SMs x CTAs per SM). When M x N gives too few tiles to fill the GPU
    and K is long (weight gradients), the library splits K across CTAs (split-K), down to
    ``SPLIT_K_MIN`` per slice. A tile's own ``efficiency`` penalizes small tiles, which reuse
    less data.
    """
    if not cal.gemm.tiles:
        return 1.0
    thin = cal.gemm.thin_efficiency.get(precision)
    if thin is not None and min(shape.m, shape.n) < min(t.m for t in cal.gemm.tiles):
        return thin
    best = 0.0
    slots = device.compute_units * cal.gemm.ctas_per_sm
    for tile in cal.gemm.tiles:
        tiles_m = math.ceil(shape.m / tile.m)
        tiles_n = math.ceil(shape.n / tile.n)
        tile_eff = (shape.m * shape.n) / (tiles_m * tile.m * tiles_n * tile.n)
        count = tiles_m * tiles_n * shape.batch
        split = max(1, min(slots // count, shape.k // SPLIT_K_MIN))
        count *= split
        wave_eff = count / (math.ceil(count / slots) * slots)
        best = max(best, tile_eff * wave_eff * tile.efficiency)
    return best


# Queries (and keys) per tile of a fused attention kernel: FlashAttention-2's forward for
# head dimensions up to 64, FlashAttention-3's and cuDNN's take 128 x 128 score tiles (others
# are 128 x 64).
ATTENTION_TILE = 128


def attention_tiling(shape: AttentionShape) -> float:
    """Useful score tiles over the tiles a fused attention kernel computes: partial tiles at
    the sequence's end, and with the causal mask the diagonal tiles, computed whole though
    half of each is masked (why short causal sequences run below the long ones' rate)."""
    q, k = shape.queries / ATTENTION_TILE, shape.keys / ATTENTION_TILE
    rows, cols = math.ceil(q), math.ceil(k)
    if shape.window:  # a band of tiles along the diagonal, window wide
        w = shape.window / ATTENTION_TILE
        useful = q * (k * w - w * w / 2) / k
        return useful / (rows * min(cols, math.ceil(w) + 1))
    useful = q * k
    computed: float = rows * cols
    if shape.causal:
        useful /= 2
        computed = computed / 2 + min(rows, cols) / 2
    return useful / computed


# The attention factors are the kernels' rates where each query block sees this many key
# blocks (4096 keys) at this head dimension; the fixed work per query block and the
# softmax's share move the rate either side of it.
REFERENCE_KEY_BLOCKS = 32
REFERENCE_HEAD_DIM = 128


def key_blocks_per_query_block(shape: AttentionShape) -> float:
    """Blocks of keys each block of queries works through, on average: all of them, half
    of them (plus the diagonal's) under the causal mask, the band under a window."""
    q, k = shape.queries / ATTENTION_TILE, shape.keys / ATTENTION_TILE
    rows, cols = math.ceil(q), math.ceil(k)
    if shape.window:
        return float(min(cols, math.ceil(shape.window / ATTENTION_TILE) + 1))
    if shape.causal:
        return (rows * cols / 2 + min(rows, cols) / 2) / rows
    return float(cols)


# The calibration's key for fused attention on fp32 inputs: SDPA's memory-efficient kernel
# running fp32 products (workload.attention.fused_math), whose rate the 16-bit kernels'
# factors do not describe. Where a calibration has not fitted it, the default kernel's
# factors stand in.
FP32_ATTENTION = "fp32"


def attention_key(op: Op) -> str:
    """The calibration key of a fused attention op: its kernel's name (empty: the default
    kernel), or FP32_ATTENTION for every kernel on fp32 inputs."""
    return FP32_ATTENTION if op.math == "fp32" else op.kernel


def kernel_cost(op: Op, device: DeviceProfile, cal: Calibration) -> KernelCost:
    """Seconds ``op`` occupies the device's compute stream."""
    if op.launches > 1:
        return _launched_cost(op, device, cal)
    bandwidth = (device.memory_bandwidth * memory_efficiency(op.bytes, cal)
                 * cal.memory.kernel_factor(op.family))
    if op.parallel_units and isinstance(device, GPUProfile):
        bandwidth *= min(1.0, op.parallel_units / device.compute_units)
    memory_s = op.bytes / bandwidth
    overhead = units.us(cal.overhead.kernel_us)
    if op.kind == "memory":
        peak, unit = device.peak_flops("fp32", matrix=False)
        compute_s = math_s = op.flops / (peak * cal.gemm_efficiency("fp32"))
        exposed = 0.0
        ramp = units.us(cal.memory.ramp_us)
    else:
        peak, unit = device.peak_flops(op.math, matrix=True)  # type: ignore[arg-type]
        eff = cal.gemm_efficiency(op.math)
        if shares_fp32_lanes(device, op.math):
            eff *= shared_lane_factor()
        if op.kind == "conv":
            eff *= cal.gemm.conv_factors.get(op.math, cal.gemm.conv_factor)
        elif op.kind == "attention":
            kernel = attention_key(op)
            eff *= cal.attention_efficiency(kernel, op.family == "attention_backward")
            if op.attention is not None:
                eff *= attention_tiling(op.attention)
                fixed = cal.attention_overhead(kernel)  # key blocks per query block
                if fixed:
                    blocks = key_blocks_per_query_block(op.attention)
                    longest = cal.attention_longest(kernel)
                    if longest is not None:
                        blocks = min(blocks, longest)
                    eff *= (blocks / (blocks + fixed)
                            * (REFERENCE_KEY_BLOCKS + fixed) / REFERENCE_KEY_BLOCKS)
                width = cal.attention_width(kernel)  # the softmax, in head-dim units
                if width:
                    widest = cal.attention_widest(kernel)
                    d = op.attention.head_dim if widest is None else min(
                        op.attention.head_dim, widest)
                    eff *= d / (d + width) * (REFERENCE_HEAD_DIM + width) / REFERENCE_HEAD_DIM
        if op.gemm is not None and isinstance(device, GPUProfile):
            # (a thin convolution runs cuDNN's kernels, not the thin GEMMs fitted)
            eff *= quantization_efficiency(op.gemm, device, cal,
                                           op.math if op.kind == "gemm" else "")
            if op.kind == "gemm":
                g = cal.gemm
                if not op.gemm.aligned(DTYPE_BYTES.get(op.math, 4)):
                    eff *= g.misaligned_factor.get(op.math, 1.0)
                slope = g.long_k_slope.get(op.math, 0.0)
                if slope and op.gemm.k > g.long_k_knee:
                    eff *= (g.long_k_knee / op.gemm.k) ** slope
                if op.gemm.layout != "nn":
                    eff *= g.layout_factors.get(op.gemm.layout, 1.0)  # type: ignore[call-overload]
        compute_s = op.flops / (peak * eff * _clock_factor(device, cal))
        math_s = compute_s
        exposed = 0.0
        if op.kind == "gemm" and cal.gemm.epilogue_exposed:
            # The result's write overlaps the main loop only in part: the shorter of the
            # two is paid again by its exposed share (a short K writes as long as it computes),
            # with the memory busy writing it.
            write_s = op.written / bandwidth
            exposed = cal.gemm.epilogue_exposed * min(compute_s, write_s)
            compute_s = max(compute_s, memory_s) + exposed
        ramp = units.us(cal.gemm.ramp_us)
    bound: Literal["compute", "memory"] = "compute" if math_s >= memory_s else "memory"
    seconds = max(compute_s, memory_s) + ramp + overhead + first_touch_cost(op, cal)
    achieved = op.flops / (seconds * peak) if op.flops else 0.0
    return KernelCost(seconds, compute_s, memory_s, bound, unit, achieved, exposed)


def _launched_cost(op: Op, device: DeviceProfile, cal: Calibration) -> KernelCost:
    """An op launched as ``op.launches`` equal kernels, ``op.streams`` at a time: rounds of
    kernels that run side by side, each round costed as one kernel of their combined work
    (its tiles share the waves; its ramp and launch gap paid once), the last round with
    what is left."""
    together = max(1, min(op.streams, op.launches))
    full, rest = divmod(op.launches, together)
    rounds = [(together, full)] + ([(rest, 1)] if rest else [])
    seconds = compute = memory = exposed = work = 0.0
    first: KernelCost | None = None
    for parts, times in rounds:
        share = parts / op.launches
        gemm = op.gemm and replace(op.gemm, batch=max(1, op.gemm.batch * parts // op.launches))
        part = replace(op, launches=1, streams=1, flops=op.flops * share,
                       bytes=op.bytes * share, alloc_bytes=op.alloc_bytes * share,
                       written=op.written * share, gemm=gemm)
        one = kernel_cost(part, device, cal)
        first = first or one
        seconds += one.seconds * times
        compute += one.compute_s * times
        memory += one.memory_s * times
        exposed += one.exposed_write_s * times
        work += one.efficiency * one.seconds * times  # FLOPs over the peak
    assert first is not None
    return KernelCost(seconds, compute, memory, first.bound, first.unit, work / seconds,
                      exposed)


def memory_efficiency(n_bytes: float, cal: Calibration) -> float:
    """Achieved fraction of peak DRAM bandwidth for an op moving ``n_bytes``: on a CPU whose
    calibration found a cache regime, ops small enough to stay in the caches run at its rate
    (an optimizer's passes over large weights stream from DRAM; small activations do not)."""
    m = cal.memory
    if m.cache_mib is not None and m.cache_efficiency is not None \
            and n_bytes <= m.cache_mib * 2**20:
        return m.cache_efficiency
    return m.max_efficiency


def _clock_factor(device: DeviceProfile, cal: Calibration) -> float:
    """Compute rate under the device's power limit, relative to the calibration's."""
    return compute_rate_factor(device, cal.idle_power_fraction, cal.power)


def first_touch_cost(op: Op, cal: Calibration) -> float:
    """Page faults of a fresh large allocation: a CPU's allocator returns big blocks to the
    OS when freed, so each new one is mapped again page by page as it is first written."""
    rate = cal.memory.first_touch_gb_s
    if rate is None or op.alloc_bytes < cal.memory.first_touch_min_mib * 2**20:
        return 0.0
    return op.alloc_bytes / units.gb_s(rate)


def host_cost(device: DeviceProfile, cal: Calibration, autograd: bool = False) -> float:
    """Host seconds to dispatch one op: framework dispatch plus the launch call on a GPU,
    plus autograd's bookkeeping for ops of the forward and backward passes."""
    extra = cal.overhead.autograd_us if autograd else 0.0
    return units.us(cal.overhead.dispatch_us + cal.overhead.launch_us + extra)


CUDNN_FAMILIES = frozenset({"batch_norm"})  # memory-bound ops PyTorch hands to cuDNN


def op_host_extra(op: Op, cal: Calibration) -> float:
    """Host seconds an op costs beyond a plain dispatch: a cuBLAS matrix product picks its
    algorithm through cuBLASLt's heuristics (an fp8 one also sets its scales); a cuDNN
    call (a convolution, or a batch norm on fp32) looks up its execution plan and launches
    through cuDNN."""
    # an op launched as several kernels from one call: each launch past the first, and
    # each kernel's own library cost
    loop = (op.launches - 1) * cal.overhead.launch_us
    if op.kind == "gemm":
        fp8 = cal.overhead.scaled_mm_us if op.math == "fp8" else 0.0
        return units.us(op.launches * (cal.overhead.cublas_us + fp8) + loop)
    cudnn = op.kind == "conv" or op.family in CUDNN_FAMILIES
    return units.us((op.launches * cal.overhead.cudnn_us if cudnn else 0.0) + loop)


def optimizer_host_s(tensors: int, cal: Calibration) -> float:
    """Host seconds of a torch.optim step() beyond its kernels' dispatch: a fixed cost and
    a cost per parameter tensor."""
    o = cal.overhead
    return units.us(o.optimizer_us + tensors * o.optimizer_tensor_us)


def copy_cost(n_bytes: float, link_bandwidth: float, latency: float, efficiency: float) -> float:
    """Seconds to copy ``n_bytes`` over a link (host-to-device): latency plus bytes/bandwidth."""
    return latency + n_bytes / (link_bandwidth * efficiency)


def loop_seconds(ops: list[Op], device: DeviceProfile, cal: Calibration) -> float:
    """Seconds per iteration when ``ops`` run back to back in a loop, as a benchmark times
    them: on a CPU the host dispatches and computes in turn; on a GPU the host runs ahead
    and the slower of the two (dispatching, or the kernels) sets the pace."""
    host = host_cost(device, cal) * len(ops) + sum(op_host_extra(op, cal) for op in ops)
    kernels = sum(kernel_cost(op, device, cal).seconds for op in ops)
    return max(host, kernels) if device.is_gpu else host + kernels
