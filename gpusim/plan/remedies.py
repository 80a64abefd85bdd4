"""What to change when a job does not fit: each candidate change is planned again, and those
that fit are listed cheapest first.

The order is what each remedy usually costs in step time, from least to most: sharding
states further (ZeRO/FSDP; communication that overlaps), on one GPU stepping the optimizer
inside backward (the same work, no gradients for the whole model), keeping fewer
activations with per-op recompute, 8-bit optimizer states, pure bf16 (no fp32 copies; a
numerical risk more than a time cost), a smaller microbatch (less efficient kernels, more of
them), full recompute (a third more compute), on one GPU offloading activations (PCIe
copies beside compute), offload to the CPUs (PCIe and a CPU step each step), more
GPUs (money, not time), and splitting layers (tensor or pipeline parallelism, which adds
communication or a bubble). A remedy is
named both as a flag of the command line and as an argument of ``gpusim.estimate``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from gpusim import units
from gpusim.comm.topology import Topology
from gpusim.errors import GpusimError, OutOfMemory
from gpusim.hardware.catalog import catalog
from gpusim.hardware.profile import GPUProfile
from gpusim.plan.job import TrainingJob
from gpusim.plan.memory import MemoryPlan
from gpusim.plan.memory_report import peak_plan
from gpusim.plan.parallel_job import ParallelConfig, ParallelJob

# How far "more GPUs" looks: the job's GPU count times up to this factor.
MOST_GPUS_FACTOR = 64


@dataclass(frozen=True)
class Remedy:
    kind: str  # one remedy of each kind is shown: the mildest that fits
    what: str  # in words
    cli: str  # command-line flags
    api: str  # keyword arguments of gpusim.estimate
    required_bytes: float  # per GPU with it applied
    fits: bool

    def describe(self, cli: bool) -> str:
        return f"{self.what} ({self.cli if cli else self.api})"


Job = TrainingJob | ParallelJob
# kind, in words, CLI flags, API arguments, the changed job (built lazily: it may not be valid)
Candidate = tuple[str, str, str, str, Callable[[], Job]]


def required_bytes(job: Job) -> tuple[float, bool]:
    """Bytes the job needs per GPU (its largest stage), and whether that fits."""
    mem = peak_plan(job)
    return mem.required_bytes, mem.fits


def _tries(job: Job) -> Iterator[tuple[Remedy, Job]]:
    for kind, what, cli, api, make in (_parallel(job) if isinstance(job, ParallelJob)
                                       else _single(job)):
        try:
            changed = make()
            need, fits = required_bytes(changed)
        except GpusimError:  # the change is not valid for this job (a split that fails)
            continue
        yield Remedy(kind, what, cli, api, need, fits), changed


def remedies(job: Job) -> list[Remedy]:
    """For each kind of change, the mildest that makes ``job`` fit, cheapest kind first;
    where none of a kind fits, its strongest try (``fits`` False)."""
    best: dict[str, Remedy] = {}
    for remedy, _ in _tries(job):
        if remedy.kind not in best or not best[remedy.kind].fits:
            best[remedy.kind] = remedy
    return list(best.values())


def combination(job: Job, most: int = 4) -> list[Remedy]:
    """Changes that fit together when none fits alone: the cheapest kinds first, each the
    mildest that fits or else the one that saves the most, until the job fits (empty when
    ``most`` changes do not get there)."""
    chosen: list[Remedy] = []
    used: set[str] = set()
    for _ in range(most):
        strongest: tuple[Remedy, Job] | None = None
        for remedy, changed in _tries(job):
            if remedy.kind in used:
                continue
            if remedy.fits:
                return [*chosen, remedy]
            if strongest is None or remedy.required_bytes < strongest[0].required_bytes:
                strongest = remedy, changed
        if strongest is None:
            return []
        chosen.append(strongest[0])
        used.add(strongest[0].kind)
        job = strongest[1]
    return []


def advice(job: Job, cli: bool) -> str:
    """What to try, in a sentence: the remedies that fit, or a combination that does."""
    found = remedies(job)
    fitting = [r for r in found if r.fits]
    if fitting:
        return "try " + ", or ".join(r.describe(cli) for r in fitting[:5])
    combined = combination(job)
    if combined:
        return ("no single change fits; together these do: "
                + " with ".join(r.describe(cli) for r in combined))
    return "no change gpusim knows makes it fit, alone or with up to three others"


def check_fits(job: TrainingJob, plan: MemoryPlan) -> None:
    """Raise OutOfMemory with the breakdown (and, when read, what to try) if ``plan`` of a
    one-device job does not fit."""
    if not plan.fits:
        _out_of_memory(job, plan, f"{job.model.name} with microbatch {job.microbatch_size}",
                       "", job.device.name)


def check_fits_parallel(job: ParallelJob, mems: list[MemoryPlan]) -> None:
    """The same for a parallel job, whose largest stage must fit."""
    stage = max(range(len(mems)), key=lambda i: mems[i].required_bytes)
    if not mems[stage].fits:
        p = job.parallel
        where = f" on pipeline stage {stage}" if p.pipeline > 1 else " on each GPU"
        _out_of_memory(job, mems[stage], f"{job.model.name} under {p.describe()}", where,
                       job.topology.gpu.name)


def _out_of_memory(job: Job, mem: MemoryPlan, what: str, where: str, device: str) -> None:
    raise OutOfMemory(
        f"{what} needs {units.human_bytes(mem.required_bytes)}{where} but {device} has "
        f"{units.human_bytes(mem.usable_bytes)} usable ({_parts(mem)})",
        required_bytes=mem.required_bytes, available_bytes=mem.usable_bytes,
        peak_bytes=mem.peak_bytes, advise=lambda cli: advice(job, cli))


def _parts(plan: MemoryPlan) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {units.human_bytes(v)}"
                     for k, v in plan.breakdown().items() if v)


def _recompute_modes(current: str) -> list[str]:
    order = ["none", "selective", "per-op", "full"]
    if current.startswith(("every-k:", "selective:", "block:")):
        return ["per-op", "full"]
    return [m for m in order[order.index(current) + 1:] if m != "selective"]


def _parallel(job: ParallelJob) -> Iterator[Candidate]:
    p = job.parallel

    def with_config(**changes: object) -> Callable[[], Job]:
        return lambda: replace(job, parallel=replace(p, **changes))  # type: ignore[arg-type]

    top_zero = 3 if p.pipeline == 1 else 1
    for zero in range(p.zero + 1, top_zero + 1):
        label = "ZeRO stage 3 (FSDP full sharding)" if zero == 3 else f"ZeRO stage {zero}"
        yield "zero", label, f"--zero {zero}", f"zero={zero}", with_config(zero=zero)
    for mode in _recompute_modes(job.checkpointing):
        yield ("recompute", f"{mode} recompute", f"--recompute {mode}",
               f"checkpointing={mode!r}",
               _with_job(job, checkpointing=mode))
    if job.optimizer in ("adam", "adamw"):
        yield ("optimizer", "8-bit optimizer states", "--optimizer adamw8bit",
               "optimizer='adamw8bit'", _with_job(job, optimizer="adamw8bit"))
    if job.precision == "bf16" and not job.pure_bf16 and not job.master_weights:
        yield ("pure", "pure bf16 (no fp32 weights, gradients or states)", "--pure-bf16",
               "pure_bf16=True", _with_job(job, pure_bf16=True))
    micro = p.microbatch_size // 2
    while micro >= 1:
        yield ("microbatch", f"microbatch {micro}", f"--microbatch-size {micro}",
               f"microbatch_size={micro}", with_config(microbatch_size=micro))
        micro //= 2
    if job.offload == "none":
        yield ("offload", "optimizer offloaded to the CPUs", "--offload optimizer",
               "offload='optimizer'", _with_job(job, offload="optimizer"))
        if p.zero == 3:
            yield ("offload", "FSDP CPU offload", "--offload params", "offload='params'",
                   _with_job(job, offload="params"))
    factor = 2
    while factor <= MOST_GPUS_FACTOR:
        gpus = job.topology.num_gpus * factor
        yield ("gpus", f"{gpus} GPUs (data parallel {p.data * factor})", f"--num-gpus {gpus}",
               f"num_gpus={gpus}", _more_gpus(job, factor))
        factor *= 2
    for name, field in (("tensor", "tensor"), ("pipeline", "pipeline")):
        size = getattr(p, field) * 2
        flag = "tp" if field == "tensor" else "pp"
        if p.data % 2 == 0:
            yield (field, f"{name} parallelism {size} on the same GPUs", f"--{flag} {size}",
                   f"{flag}={size}",
                   with_config(**{field: size, "data": p.data // 2,
                                  "zero": p.zero if field == "tensor" else min(p.zero, 1)}))


def _with_job(job: Job, **changes: object) -> Callable[[], Job]:
    return lambda: replace(job, **changes)  # type: ignore[arg-type]


def _more_gpus(job: ParallelJob, factor: int) -> Callable[[], Job]:
    def plan() -> Job:
        p = job.parallel
        config: ParallelConfig = replace(p, data=p.data * factor)
        batch = max(job.batch_size, p.microbatch_size * config.data)
        topo = Topology.build(job.topology.system, job.topology.num_gpus * factor,
                              job.topology.gpu)
        return replace(job, topology=topo, parallel=config,
                       batch_size=batch - batch % (p.microbatch_size * config.data))
    return plan


def _single(job: TrainingJob) -> Iterator[Candidate]:
    def changed(**changes: object) -> Callable[[], Job]:
        return _with_job(job, **changes)

    if job.precision in ("fp32", "tf32") and job.device.is_gpu:
        yield ("precision", "bf16 mixed precision", "--precision bf16", "precision='bf16'",
               changed(precision="bf16"))
    if (not job.optimizer_in_backward and job.grad_accum == 1 and job.offload == "none"
            and job.precision != "fp16" and not job.master_weights):
        # the same optimizer work, inside backward: no time lost
        yield ("step_in_backward", "optimizer stepped inside backward",
               "--optimizer-in-backward", "optimizer_in_backward=True",
               changed(optimizer_in_backward=True))
    for mode in _recompute_modes(job.checkpointing):
        yield ("recompute", f"{mode} recompute", f"--recompute {mode}",
               f"checkpointing={mode!r}", changed(checkpointing=mode))
    if job.optimizer in ("adam", "adamw"):
        yield ("optimizer", "8-bit optimizer states", "--optimizer adamw8bit",
               "optimizer='adamw8bit'", changed(optimizer="adamw8bit"))
    if job.precision == "bf16" and not job.pure_bf16 and not job.master_weights:
        yield ("pure", "pure bf16 (no fp32 weights, gradients or states)", "--pure-bf16",
               "pure_bf16=True", changed(pure_bf16=True))
    accum = job.grad_accum * 2
    while accum <= job.batch_size:
        if job.batch_size % accum == 0:
            yield ("microbatch", f"microbatch {job.batch_size // accum} ({accum} accumulated)",
                   f"--grad-accum {accum}", f"grad_accum={accum}", changed(grad_accum=accum))
        accum *= 2
    if job.device.is_gpu and not job.offload_activations:
        yield ("activation_offload", "activations offloaded to host memory",
               "--offload-activations", "offload_activations=True",
               changed(offload_activations=True))
    if job.device.is_gpu and job.offload == "none" and not job.optimizer_in_backward:
        yield ("offload", "optimizer offloaded to the CPU", "--offload optimizer",
               "offload='optimizer'", changed(offload="optimizer"))
    if job.device.is_gpu:
        bigger = sorted((g for g in catalog().all(GPUProfile)
                         if g.memory_bytes > job.device.memory_bytes
                         and g.vendor == job.device.vendor),
                        key=lambda g: (g.memory_bytes, g.name))
        for gpu in bigger:
            yield ("gpu", f"a GPU with more memory, e.g. {gpu.name}", f"--gpu {gpu.name}",
                   f"gpu={gpu.name!r}", changed(device=gpu))
