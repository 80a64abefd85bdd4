"""What an estimate assumed, in words: the lines printed under "assumptions" for one
device and for many."""

from __future__ import annotations

from gpusim import units
from gpusim.cost.kernels import FP32_ATTENTION
from gpusim.hardware.calibration import calibration_for
from gpusim.hardware.power import compute_rate_factor
from gpusim.hardware.profile import DeviceProfile
from gpusim.plan.activation_offload import offload_split
from gpusim.plan.autocast import autocasts
from gpusim.plan.job import TrainingJob
from gpusim.plan.memory import activations_by_layer
from gpusim.plan.parallel_job import ParallelJob
from gpusim.sim.pipeline import COMM_SLOWDOWN
from gpusim.sim.ranks import Straggler, rank_coords
from gpusim.stack import Stack
from gpusim.workload.layers import Conv2d

_ENERGY = ("energy: each device draws idle power, plus (power limit - idle) while a kernel works "
           "its bottleneck unit at the attainable rate (ramps, launch gaps, waits and exposed "
           "communication at idle power); board power only, no host or cooling")


def power_limit_line(device: DeviceProfile) -> str | None:
    """What a board power limit below the TDP, or a die allowed more or less power than the
    one the calibration was measured on, does to the estimate, in words; None where
    neither applies."""
    cal = calibration_for(device)
    if device.power_limit >= device.tdp_w:
        factor = compute_rate_factor(device, cal.idle_power_fraction, cal.power)
        if cal.power is None and device.sustained_clock_mhz is not None:
            return (f"{device.name} under sustained load at {device.sustained_clock_mhz:g} MHz "
                    f"(measured; boost {device.boost_clock_mhz:g} MHz), held there by its "
                    f"{device.tdp_w:g} W power limit: compute-bound kernels at {factor:.0%} "
                    f"of the boost clock's rate; memory-bound kernels unchanged")
        if cal.power is None or abs(factor - 1.0) < 0.005:
            return None
        return (f"{device.name} at its {device.tdp_w:g} W TDP: compute-bound kernels at "
                f"{factor:.0%} of the rate its calibration (measured on "
                f"{cal.power.measured_device}) gives, for the clock its power allows a die of "
                f"its compute units and boost clock ({cal.power.name}); memory-bound kernels "
                f"unchanged")
    head = f"{device.name} held to a {device.power_limit:g} W power limit (TDP {device.tdp_w:g} W)"
    if cal.power is None:
        return (f"{head}: not modelled, no power calibration for {device.architecture}; "
                f"kernels run as at the TDP")
    factor = compute_rate_factor(device, cal.idle_power_fraction, cal.power)
    return (f"{head}: compute-bound kernels at {factor:.0%} of their rate at the TDP, its "
            f"clock lowered until dense matrix work fits ({cal.power.name}); memory-bound "
            f"kernels unchanged")


def _with_power(out: list[str], device: DeviceProfile) -> list[str]:
    line = power_limit_line(device)
    return out if line is None else [line, *out]


def _simulated_ranks(job: ParallelJob, per_rank: bool, straggler: Straggler | None) -> str:
    p = job.parallel
    if not per_rank and straggler is None:
        return "one representative rank per pipeline stage"
    text = (f"every rank: {p.data * p.pipeline} units (data-parallel replicas x stages), each "
            f"a tensor-parallel group of {p.tensor} in lockstep")
    if straggler is not None:
        at = rank_coords(straggler.rank, p.tensor, p.data, p.pipeline)
        slow = [f"kernels x{straggler.compute:g}"] if straggler.compute > 1 else []
        slow += [f"transfers x{straggler.link:g}"] if straggler.link > 1 else []
        text += (f"; straggler rank {straggler.rank} (stage {at.stage}, replica {at.replica}): "
                 f"{', '.join(slow) or 'no slowdown'}")
    return text


def parallel_assumptions(job: ParallelJob, assumed_system: bool, per_rank: bool = False,
                          straggler: Straggler | None = None,
                          comm_slowdown: float | None = None) -> list[str]:
    p, topo = job.parallel, job.topology
    num = job.whole.numerics()
    out = [f"{topo.num_gpus} GPUs on {topo.num_nodes} node(s) of {topo.system.full_name}"
           + (" (an assumed design: no system profile names this GPU; give --system)"
              if assumed_system else ""),
           f"{p.describe()}; {job.microbatches} microbatches per pipeline per step"]
    if job.master_weights:
        grads = "fp32" if job.whole.reduce_bytes == 4 else job.precision.replace("fp8", "bf16")
        masters = ("bf16 master copies and optimizer states" if job.bf16_states
                   else "fp32 master copies")
        out.append(f"Megatron-LM style: weights in {num.activation} with {masters}; "
                   f"gradients reduced in {grads}")
    elif job.pure_bf16:
        sharding = {0: "replicated (DDP)", 1: "optimizer states sharded (ZeRO-1)",
                    2: "optimizer states and gradients sharded (ZeRO-2)",
                    3: "all sharded, gathered a unit at a time (FSDP)"}[p.zero]
        out.append(f"pure bf16: weights, gradients and optimizer states in bf16, no fp32 "
                   f"copies; {sharding}")
    elif job.fsdp and job.whole.mixed_precision:
        out.append(f"PyTorch FSDP (full sharding) with mixed precision: fp32 weight, gradient "
                   f"and optimizer shards; each unit's weights gathered in {num.activation} "
                   f"(the running unit and the prefetched next), so every layer computes in "
                   f"{num.activation}; gradients reduce-scattered in "
                   f"{'bf16' if job.bf16_grads else 'fp32'}")
    elif job.fsdp:
        out.append("PyTorch FSDP (full sharding) in fp32: weights gathered a unit at a time, "
                   "gradients reduce-scattered")
    else:
        sharded = {1: " and a sharded optimizer (ZeRO-1)",
                   2: ", sharded optimizer states and gradients (ZeRO-2)"}.get(p.zero, "")
        out.append(f"PyTorch DDP with autocast{sharded}: matrix products in {num.matmul}, "
                   "fp32 weights and gradients"
                   + (", gradients reduced in bf16" if job.bf16_grads else ""))
    if job.frozen:
        trains = job.trainable_params(job.model.layers)
        total = job.model.parameters
        out.append(f"frozen: {', '.join(job.frozen)}; {units.human_count(trains)} of "
                   f"{units.human_count(total)} parameters train, and only their gradients "
                   "are computed, reduced and stepped")
    if p.data > 1 and p.zero <= 1:
        out.append("data-parallel gradients reduced in 25 MiB buckets during the last backward "
                   "pass" if p.overlap_grad_reduce else
                   "data-parallel gradients reduced in one buffer after the last backward pass")
    if not p.sequence_parallel:
        tp_overlap = " (no overlap with compute)"
    elif job.whole.framework.tensor_parallel == "dtensor":
        tp_overlap = ("; column-parallel layers keep their gathered input for backward "
                      "(PyTorch DTensor), whose gradient reduce-scatter hides behind the "
                      "weight-gradient GEMM")
    else:
        tp_overlap = ("; the backward pass's input gather and gradient reduce-scatter hide "
                      "behind their layer's GEMMs")
    out.append(f"tensor-parallel collectives on the critical path{tp_overlap}; collectives "
               "take the fastest NCCL algorithm for their size")
    if p.expert > 1:
        out.append("expert-parallel all-to-alls (dispatch and combine) beside another "
                   "microbatch's compute, which they slow as any collective does, the part "
                   "it cannot cover exposed (pipeline warm-up and cool-down taken as "
                   "overlapped too)" if p.ep_overlap else
                   "expert-parallel all-to-alls (dispatch and combine) on the critical path "
                   "(--ep-overlap runs them beside another microbatch's compute)")
        out.append("routing balanced over the expert-parallel ranks (--moe-imbalance 1, as "
                   "forced load balancing gives; dropless runs with learned routing load "
                   "some ranks more and run slower)" if p.moe_imbalance == 1.0 else
                   f"the busiest expert-parallel rank computes {p.moe_imbalance:g}x the mean "
                   f"token copies and receives as many bytes; every rank waits for it at "
                   f"each all-to-all (--moe-imbalance)")
    if p.moe_capacity:
        out.append(f"each expert computes exactly {p.moe_capacity:g}x the mean token copies, "
                   f"padded (--pad-to-capacity)" if p.moe_pad else
                   f"experts drop the token copies beyond {p.moe_capacity:g}x the mean "
                   f"(--capacity-factor): the busiest takes at most that many")
    beside = ("data-parallel collective or overlapped expert-parallel all-to-all"
              if p.ep_overlap else "data-parallel collective")
    if comm_slowdown is None:
        slowdown = (f"kernels {100 * COMM_SLOWDOWN:g}% slower while a {beside} runs beside "
                    f"them (the average measured in arXiv 2507.03114; --comm-slowdown)")
    elif comm_slowdown:
        slowdown = (f"kernels {100 * comm_slowdown:g}% slower while a {beside} runs beside "
                    f"them")
    else:
        slowdown = "no compute slowdown from communication kernels (--comm-slowdown 0)"
    node_links = ("tensor- and data-parallel traffic share a GPU's links inside a "
                  "node" if job.topology.peers_share_links else
                  "tensor- and data-parallel peers have links of their own (mesh)")
    out.append(f"{_simulated_ranks(job, per_rank, straggler)}; pipeline transfers and "
               f"data-parallel collectives share a GPU's NIC when both leave the node; "
               f"{node_links}; {slowdown}")
    out.append(_parallel_input(job))
    out.append(_ENERGY)
    return _with_power(out, topo.gpu)


def _parallel_input(job: ParallelJob) -> str:
    if not job.loader_workers:
        return "input: synthetic data already on the device (no loader, no copy)"
    inp = job.model.input
    cores = job.host_cores_per_replica
    share = ("the node's CPU cores unknown (no CPU in the system profile), so workers are "
             "not capped" if cores is None else
             f"{cores} of the node's CPU cores per replica cap the workers that help")
    return (f"input: {inp.description}; {job.loader_workers} loader workers per data-parallel "
            f"replica at {inp.loader_cpu_s * 1e3:.3g} ms CPU per sample, running on through "
            f"the step; {share}; host-to-device copies not modelled")


def single_assumptions(job: TrainingJob) -> list[str]:
    num = job.numerics()
    held = "bf16 (pure bf16: no fp32 copies)" if job.pure_bf16 else "fp32"
    out = [f"matrix products in {num.matmul}, convolutions in {num.conv}, activations in "
           f"{num.activation}; weights, gradients and optimizer states in {held}"]
    if job.frozen and job.mixed_precision:
        out.append(f"frozen weights held in {num.activation} (as fine-tuning loads them)")
    if job.precision == "fp32" and num.conv == "tf32":
        out.append("PyTorch defaults: cuDNN may use TF32 for fp32 convolutions, cuBLAS may not")
    if job.loader_workers:
        inp = job.model.input
        out.append(f"input: {inp.description}; {job.loader_workers} loader workers at "
                   f"{inp.loader_cpu_s * 1e3:.3g} ms CPU per sample")
    else:
        out.append("input: synthetic data already on the device (no loader, no copy)")
    if job.grad_accum > 2:
        out.append(f"{job.grad_accum} microbatches: 2 simulated in detail, the rest repeat the "
                   "last")
    if job.framework.compiled:
        out.append("torch.compile (TorchInductor, default mode): each norm and activation one "
                   "generated kernel, casts and fp8 scale reductions folded into their "
                   "producers, memory-bound kernels at the device's achieved bandwidth (a "
                   "residual add stays its own kernel); matrix products and attention as in "
                   "eager; the host launches kernels without per-op Python; no CUDA graphs")
    else:
        out.append("PyTorch eager execution, one kernel per op, no CUDA graphs; a host "
                   "synchronize at the end of each step")
    convs = [la for la in job.model.layers if isinstance(la, Conv2d)]
    if job.device.is_gpu and convs and not all(la.channels_last for la in convs):
        out.append("tensors in PyTorch's default NCHW layout: cuDNN transposes them for its "
                   "tensor-core convolutions (--channels-last skips that)")
    elif job.device.is_gpu and convs:
        out.append("tensors channels-last (NHWC), as cuDNN's tensor-core convolutions take "
                   "them: no transposes")
    if autocasts(job):
        out.append("autocast: norms, softmax and a transformer's residual stream stay fp32; "
                   "each fp32 weight is cast once per forward")
    out += memory_saver_lines(job)
    out.append(_ENERGY)
    return _with_power(out, job.device)


def memory_saver_lines(job: TrainingJob) -> list[str]:
    """What stepping in backward and activation offloading assume, in words."""
    out = []
    if job.optimizer_in_backward:
        out.append("optimizer stepped inside backward (torchtune's optimizer_in_bwd): each "
                   "parameter has its own optimizer, stepped as soon as its gradient is "
                   "accumulated, the gradient then freed, so about one layer's gradients are "
                   "alive at a time; the same optimizer work, a kernel per pass per tensor, "
                   "interleaved with the backward kernels")
    if job.offload_activations:
        offloaded = offload_split(job, activations_by_layer(job)[0])[0]
        out.append(f"activations offloaded (torchtune's enable_activation_offloading): "
                   f"{units.human_bytes(offloaded)} a microbatch to pinned host memory, down "
                   f"in forward and up in backward over the host link beside compute; the "
                   f"output head's and the loss's stay, with about two blocks' worth in "
                   f"flight; what the copies take beyond each pass is 'activation offload'")
    return out


OFFLOAD_TEXT = {
    "optimizer": "optimizer offloaded (ZeRO-Offload): master weights and Adam states in host "
                 "memory; each step the gradients go down PCIe, the CPUs step, the weights "
                 "come back, in turn after the backward pass",
    "params": "FSDP CPU offload: weight, gradient and optimizer shards in host memory; the "
              "CPUs step; gradients down and weights up over PCIe after the backward pass",
}


def attention_unmeasured(framework: Stack, device: DeviceProfile, fp32: bool = False) -> str:
    """A note when the attention kernel that runs has no efficiency of its own in the
    device's calibration (so the default fused kernel's stands in), or when ``fp32`` inputs
    make SDPA run another kernel than the one named, else ''."""
    kernel = framework.attention
    if kernel == "math":
        return ""
    cal = calibration_for(device)
    if fp32 and device.is_gpu:
        notes = []
        if kernel != "auto":
            notes.append(f"{kernel} attention takes 16-bit inputs only: on fp32 ones SDPA's "
                         f"memory-efficient kernel runs")
        if FP32_ATTENTION not in cal.gemm.attention_kernels:
            notes.append(f"fp32 attention: no efficiency measured for it in calibration "
                         f"{cal.name}; costed as the default fused attention kernel")
        return "; ".join(notes)
    if kernel == "auto" or kernel in cal.gemm.attention_kernels:
        return ""
    return (f"{kernel} attention: no efficiency measured for it in calibration {cal.name}; "
            f"costed as the default fused attention kernel")
