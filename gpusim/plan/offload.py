"""CPU offload: optimizer states (and, under FSDP, the weight and gradient shards) kept in
host memory, the optimizer step run by the CPU.

- ``optimizer`` is ZeRO-Offload's (DeepSpeed ``offload_optimizer``): the fp32 master weights,
  the Adam moments and the step live on the host. Each step the gradients go down over PCIe,
  the CPU steps every parameter (DeepSpeed's CPU Adam reads the weight, gradient and two
  moments and writes back three: 28 bytes a parameter, at the host's memory bandwidth), and
  the updated weights come back up in the compute type.
- ``params`` is FSDP's ``CPUOffload(offload_params=True)``: the fp32 weight and gradient
  shards live on the host too; the GPU holds only the units it has gathered.

The transfers and the CPU step are serial after the backward pass; frameworks that overlap
the gradients' trip with backward would hide part of the first transfer. Under ``params``
each chunk's fp32 shard also comes up over PCIe before every gather, forward and backward
(gpusim.sim.pipeline), on the same stream as the gather.
"""

from __future__ import annotations

from typing import Literal

from gpusim.comm.topology import system_for_gpu
from gpusim.cost.kernels import copy_cost
from gpusim.errors import InvalidConfig
from gpusim.hardware.calibration import Calibration
from gpusim.hardware.catalog import host_link, load_cpu
from gpusim.hardware.profile import GPUProfile, SystemProfile

Offload = Literal["none", "optimizer", "params"]
OFFLOADS: tuple[str, ...] = ("none", "optimizer", "params")
# DeepSpeed's CPU Adam: reads fp32 weight, gradient, exp_avg, exp_avg_sq; writes three.
CPU_ADAM_BYTES_PER_PARAM = 28.0


def check_offload(offload: str, zero: int | None = None) -> None:
    if offload not in OFFLOADS:
        raise InvalidConfig(f"unknown offload {offload!r}; use one of {', '.join(OFFLOADS)}")
    if offload == "params" and zero is not None and zero != 3:
        raise InvalidConfig("--offload params keeps FSDP's weight shards on the host; it "
                            "needs --zero 3 (use --offload optimizer otherwise)")


def offload_seconds(params: float, grad_bytes: int, weight_bytes: int, gpu: GPUProfile,
                    system: SystemProfile | None, cal: Calibration, sharing: int = 1) -> float:
    """Seconds a step spends on an offloaded optimizer for ``params`` parameters: the
    gradients down, the CPU's step, the weights up. ``sharing`` GPUs of a node share its
    CPUs' memory bandwidth."""
    link = host_link(gpu)
    down = copy_cost(params * grad_bytes, link.bandwidth, link.latency, cal.pcie_efficiency)
    up = copy_cost(params * weight_bytes, link.bandwidth, link.latency, cal.pcie_efficiency)
    cpu_bw = _host_bandwidth(gpu, system) / max(sharing, 1)
    return down + params * CPU_ADAM_BYTES_PER_PARAM / cpu_bw + up


def _host_bandwidth(gpu: GPUProfile, system: SystemProfile | None) -> float:
    """Bytes per second the node's CPUs reach in memory: the system's CPU profile, times its
    sockets; a system without one takes the catalog system built around the GPU."""
    node = system if system is not None and system.cpu else system_for_gpu(gpu)[0]
    if not node.cpu:
        raise InvalidConfig(f"{node.name} names no CPU, so an offloaded optimizer step has "
                            f"no speed; give a --system whose profile has one")
    cpu = load_cpu(node.cpu)
    return cpu.memory_bandwidth * max(node.cpus_per_node, 1)
