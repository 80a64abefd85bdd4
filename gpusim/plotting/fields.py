"""Axis labels, with units, for the names a sweep varies and the metrics it records.

A name is looked up among the estimate keywords and metrics this module knows; any other takes
its unit from its suffix (gpusim names units in keys: ``memory_bandwidth_gb_s``, ``tdp_w``)
and the rest of it as words. Profile fields lose their ``gpu.`` prefix, and an entry of a
per-precision table names its precision:

>>> label("gpu.memory_bandwidth_gb_s")
'memory bandwidth (GB/s)'
>>> label("gpu.matrix_tflops.bf16")
'matrix peak, bf16 (TFLOP/s)'
>>> label("gpu.tdp_w"), label("batch_size"), label("bw")
('TDP (W)', 'batch size (samples)', 'bw')
>>> quantity("peak_memory_bytes")
Quantity(words='peak memory', unit='GiB', scale=1073741824.0)
>>> quantity("gpu.tdp_w").setting(350), quantity("precision").setting("bf16")
('TDP=350 W', 'precision=bf16')
"""

from __future__ import annotations

from dataclasses import dataclass

from gpusim import units


@dataclass(frozen=True)
class Quantity:
    """How a plot shows a value: in words, its unit, and the data units in one displayed unit
    (bytes shown in GiB have ``scale`` 2**30; data stay in their own units)."""

    words: str
    unit: str = ""
    scale: float = 1.0

    @property
    def label(self) -> str:
        """An axis label: ``memory bandwidth (GB/s)``."""
        return f"{self.words} ({self.unit})" if self.unit else self.words

    def setting(self, value: object) -> str:
        """One value as a legend or a panel title names it: ``memory bandwidth=2000 GB/s``."""
        shown = (f"{value / self.scale:g}" if isinstance(value, int | float)
                 else str(value))
        return f"{self.words}={shown}" + (f" {self.unit}" if self.unit else "")


KNOWN = {
    # estimate() keywords
    "batch_size": Quantity("batch size", "samples"),
    "microbatch_size": Quantity("microbatch size", "samples"),
    "seq_len": Quantity("sequence length", "tokens"),
    "grad_accum": Quantity("gradient accumulation", "microbatches per step"),
    "num_gpus": Quantity("GPUs"),
    "tp": Quantity("tensor-parallel size", "GPUs"),
    "pp": Quantity("pipeline stages"),
    "dp": Quantity("data-parallel size", "GPUs"),
    "cp": Quantity("context-parallel size", "GPUs"),
    "ep": Quantity("expert-parallel size", "GPUs"),
    "virtual_stages": Quantity("model chunks per pipeline stage"),
    "shard_group": Quantity("ZeRO shard group", "GPUs"),
    "zero": Quantity("ZeRO stage"),
    "epochs": Quantity("epochs"),
    "dataset_size": Quantity("dataset size", "samples"),
    "tokens": Quantity("training tokens"),
    "steps": Quantity("optimizer steps"),
    "loader_workers": Quantity("data-loader workers"),
    "usd_per_gpu_hour": Quantity("price", "USD per GPU-hour"),
    "comm_slowdown": Quantity("kernel slowdown beside communication", "fraction"),
    "checkpointing": Quantity("activation checkpointing"),
    "lora_rank": Quantity("LoRA rank"),
    "lora_dropout": Quantity("LoRA dropout", "fraction"),
    # sweep metrics
    "step_time_s": Quantity("step time", "s"),
    "samples_per_s": Quantity("throughput", "samples/s"),
    "tokens_per_s": Quantity("throughput", "tokens/s"),
    "time_to_train_s": Quantity("time to train", "s"),
    "cost_usd": Quantity("cost", "USD"),
    "energy_kwh": Quantity("energy", "kWh"),
    "peak_memory_bytes": Quantity("peak memory", "GiB", units.GIB),
    "mfu": Quantity("MFU", "% of peak FLOP/s", 0.01),
}
# Suffix, unit, data units in one displayed unit; the first that matches wins.
SUFFIXES = (
    ("_gb_s", "GB/s", 1.0), ("_tflops", "TFLOP/s", 1.0), ("_gib", "GiB", 1.0),
    ("_mib", "MiB", 1.0), ("_bytes", "GiB", units.GIB), ("_mhz", "MHz", 1.0),
    ("_bits", "bits", 1.0), ("_kwh", "kWh", 1.0), ("_usd", "USD", 1.0), ("_us", "µs", 1.0),
    ("_ms", "ms", 1.0), ("_w", "W", 1.0), ("_s", "s", 1.0),
)
WORDS = {
    "tdp": "TDP", "nvlink": "NVLink", "pcie": "PCIe", "gen": "generation", "l2": "L2",
    "l3": "L3", "simd": "SIMD", "fma": "FMA", "gpu": "GPU", "gpus": "GPUs", "cpu": "CPU",
    "matrix": "matrix peak", "vector": "vector peak", "mfu": "MFU", "lora": "LoRA",
}
GPU_PREFIX = "gpu."  # a device-profile field, as a sweep names it


def quantity(name: str) -> Quantity:
    """The label and display scale of a varied field or a metric."""
    if name in KNOWN:
        return KNOWN[name]
    field = name.removeprefix(GPU_PREFIX)
    field, _, entry = field.partition(".")  # matrix_tflops.bf16: one precision's entry
    unit, scale = "", 1.0
    for suffix, suffix_unit, suffix_scale in SUFFIXES:
        if field.endswith(suffix) and len(field) > len(suffix):
            field, unit, scale = field[: -len(suffix)], suffix_unit, suffix_scale
            break
    words = " ".join(WORDS.get(word, word) for word in field.split("_") if word)
    return Quantity(words + (f", {entry}" if entry else ""), unit, scale)


def label(name: str) -> str:
    """An axis label for a varied field or a metric: words and a unit."""
    return quantity(name).label
