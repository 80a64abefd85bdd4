"""``gpusim measure``: run a suite on this machine's GPU (or CPU) and write its JSON.

Progress goes to stderr, one line per case; a short table is printed last; the file goes to
``<out>/<suite>.json`` with provenance and the switches that change the answer.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from gpusim.errors import InvalidConfig, UnknownName
from gpusim.hardware.catalog import catalog
from gpusim.hardware.profile import CPUProfile, DeviceProfile
from gpusim.measure import micro, micro_layers, models, provenance, results
from gpusim.measure.timing import REPEATS, Timing

CPU_CACHE_BYTES = 64 * 2**20  # rotate past a large L3
# How long the sustained GEMM runs: long enough for the clock to settle under the power
# limit and the heat (a training step runs seconds of such products back to back).
SUSTAINED_S = 20.0


def torch_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def resolve_device(name: str | None, device: torch.device) -> DeviceProfile:
    """The profile measured: ``name``, else the CUDA device's own name matched in the catalog."""
    if name is None and device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        try:
            found = catalog().find(name)
        except UnknownName as exc:
            raise InvalidConfig(f"no profile matches this GPU ({name}); pass --device with "
                                "the profile to record the measurements under") from exc
        if not isinstance(found, DeviceProfile):
            raise InvalidConfig(f"{name} matched {found.name}, which is not a device profile")
        return found
    if name is None:
        cpus = ", ".join(p.name for p in catalog().all(CPUProfile))
        raise InvalidConfig(f"no GPU here, so this measures the CPU: pass --device with its "
                            f"CPU profile ({cpus})")
    found = catalog().find(name)
    if not isinstance(found, DeviceProfile):
        raise InvalidConfig(f"{name} is a {found.kind} profile, not a GPU or CPU")
    if found.is_gpu != (device.type == "cuda"):
        where = "a GPU" if device.type == "cuda" else "only the CPU"
        raise InvalidConfig(f"{found.name} is a {'GPU' if found.is_gpu else 'CPU'} profile but "
                            f"this machine has {where} to measure")
    return found


def _timed(case: dict[str, Any], timing: Timing) -> dict[str, Any]:
    return {**case, **timing.to_dict()}


def micro_cases(device: torch.device, quick: bool) -> Iterator[
        tuple[dict[str, Any], Callable[[int], Timing | dict[str, Timing]]]]:
    """(case description, timing function of repeats) for every micro case."""
    lim = micro.Limits.for_device(device)
    cache = (getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20)
             if device.type == "cuda" else CPU_CACHE_BYTES)
    yield {"id": "dispatch", "kind": "dispatch"}, lambda r: micro.time_dispatch(device, r)
    yield ({"id": "autograd", "kind": "autograd"},
           lambda r: micro.time_autograd_dispatch(device, r))
    if device.type == "cuda":
        yield {"id": "launch", "kind": "launch"}, lambda r: micro.time_launch(device, r)
    shapes = micro.gemm_shapes()[:4] if quick else micro.gemm_shapes()
    for prec in lim.precisions:
        for m, n, k in shapes:
            if 2.0 * m * n * k <= lim.max_gemm_flops:
                yield ({"id": f"gemm/{prec}/{m}x{n}x{k}", "kind": "gemm", "precision": prec,
                        "m": m, "n": n, "k": k},
                       lambda r, m=m, n=n, k=k, p=prec: micro.time_gemm(m, n, k, p, device, r))
        for m, n, k in micro.misaligned_gemm_shapes()[: 1 if quick else None]:
            if 2.0 * m * n * k <= lim.max_gemm_flops:
                yield ({"id": f"gemm/{prec}/{m}x{n}x{k}", "kind": "gemm", "precision": prec,
                        "m": m, "n": n, "k": k, "misaligned": True},
                       lambda r, m=m, n=n, k=k, p=prec: micro.time_gemm(m, n, k, p, device, r))
        if lim.fp8 and prec == "bf16":
            for m, n, k in shapes:
                if 2.0 * m * n * k <= lim.max_gemm_flops and not (m % 16 or n % 16 or k % 16):
                    yield ({"id": f"gemm/fp8/{m}x{n}x{k}", "kind": "gemm", "precision": "fp8",
                            "m": m, "n": n, "k": k},
                           lambda r, m=m, n=n, k=k: micro.time_gemm_fp8(m, n, k, device, r))
    convs = micro.conv_shapes(lim.conv_batch)[:2] if quick else micro.conv_shapes(lim.conv_batch)
    conv_precisions = ("fp32", "bf16")
    for prec in conv_precisions:
        for shape in convs:
            oh = (shape["height"] + 2 * shape["padding"] - shape["kernel"]) // shape["stride"] + 1
            flops = 2.0 * shape["batch"] * shape["out_channels"] * oh * oh * \
                shape["in_channels"] * shape["kernel"] ** 2
            if flops > lim.max_gemm_flops / 4:
                continue
            key = "x".join(str(shape[k]) for k in ("batch", "in_channels", "out_channels",
                                                    "kernel", "height", "stride"))
            yield ({"id": f"conv/{prec}/{key}", "kind": "conv", "precision": prec, **shape},
                   lambda r, s=shape, p=prec: micro.time_conv(s, p, device, r))
            if device.type == "cuda" and prec == "bf16":
                # The same convolution channels-last: cuDNN's tensor-core kernels without
                # the transposes NCHW pays, so a fit tells the two apart.
                yield ({"id": f"conv/{prec}/nhwc/{key}", "kind": "conv", "precision": prec,
                        "layout": "nhwc", **shape},
                       lambda r, s=shape, p=prec: micro.time_conv(s, p, device, r, True))
    att_precisions = ("bf16",) if device.type == "cuda" else ("fp32", "bf16")
    for prec in att_precisions:
        for shape in micro.attention_shapes(lim.attention_batch)[: 1 if quick else None]:
            flops = 4.0 * shape["batch"] * shape["heads"] * shape["seq"] ** 2 * shape["head_dim"]
            if flops * 3.5 > lim.max_gemm_flops / 4:
                continue
            key = "x".join(str(shape[k]) for k in ("batch", "heads", "seq", "head_dim"))
            key += "-causal" if shape["causal"] else ""
            yield ({"id": f"attention/{prec}/{key}", "kind": "attention", "precision": prec,
                    "backend": micro_layers.default_sdpa_backend(shape, prec, device), **shape},
                   lambda r, s=shape, p=prec: micro.time_attention(s, p, device, r))
    yield from _sdpa_cases(device, quick)
    sizes = micro.elementwise_sizes(lim.max_bytes)
    for op in ("copy", "add", "sum", "add_alloc", "cast"):
        for size in sizes[::3] if quick else sizes:
            yield ({"id": f"elementwise/{op}/{size}", "kind": "elementwise", "op": op,
                    "bytes": size, "dtype": "fp32"},
                   lambda r, o=op, s=size: micro.time_elementwise(o, s, device, r, cache))
    if device.type == "cuda":
        # The same passes over bf16 elements: whether a 16-bit elementwise kernel moves its
        # bytes at an fp32 one's rate (PyTorch's vector width per thread is counted in
        # elements). Measured, not fitted, until the memory fit takes a type apart.
        for op in ("copy", "add"):
            for size in sizes[::3] if quick else sizes[::2]:
                yield ({"id": f"elementwise/bf16/{op}/{size}", "kind": "elementwise",
                        "op": op, "bytes": size, "dtype": "bf16", "fit": False},
                       lambda r, o=op, s=size: micro.time_elementwise(
                           o, s, device, r, cache, dtype=torch.bfloat16))
    yield from _row_kernel_cases(device, quick, lim.max_bytes / 4, cache)
    yield from _linear_cases(device, quick, lim.max_gemm_flops, cache)
    yield from _layer_host_cases(device, quick)
    yield from _host_step_cases(device, quick)
    yield from _adamw_cases(device, quick)
    yield from _batch_norm_cases(device, quick, 128 if device.type == "cuda" else 2)
    if device.type == "cuda":
        yield from _graph_cases(device, quick, cache)
        # minutes of training, not bursts: the steady clock under the power limit
        seconds = 3.0 if quick else SUSTAINED_S
        yield ({"id": "sustained/bf16/8192x8192x8192", "kind": "sustained_gemm",
                "precision": "bf16", "m": 8192, "n": 8192, "k": 8192, "seconds": seconds},
               lambda r: micro.time_sustained_gemm(8192, 8192, 8192, "bf16", device, seconds))
        for direction in ("h2d", "d2h"):
            for pinned in (True, False):
                for size in (2**16, 2**20, 2**24, 2**28, 2**30):
                    yield ({"id": f"copy/{direction}/{'pinned' if pinned else 'pageable'}/"
                                  f"{size}", "kind": "host_copy", "direction": direction,
                            "pinned": pinned, "bytes": size},
                           lambda r, d=direction, p=pinned, s=size:
                           micro.time_host_copy(s, d, p, device, r))


def _linear_cases(device: torch.device, quick: bool, max_flops: float, cache: float
                  ) -> Iterator[tuple[dict[str, Any], Callable[[int], dict[str, Timing]]]]:
    """bf16 linear layers, forward and backward: the products in the layouts training
    uses (forward nt, input gradient nn, weight gradient tn)."""
    tokens = (4096, 16384) if device.type == "cuda" else (256,)
    for t in tokens:
        for rows, i, o in micro_layers.linear_shapes(t)[: 2 if quick else None]:
            if 6.0 * rows * i * o > max_flops * 3:
                continue
            yield ({"id": f"linear/bf16/{rows}x{i}x{o}", "kind": "linear", "precision": "bf16",
                    "tokens": rows, "in_features": i, "out_features": o},
                   lambda r, m=rows, a=i, b=o: micro_layers.time_linear(m, a, b, device, r,
                                                                        cache))


def _layer_host_cases(device: torch.device, quick: bool) -> Iterator[
        tuple[dict[str, Any], Callable[[int], dict[str, Timing]]]]:
    """Each layer of tiny models, forward and backward alone: the host's cost per layer."""
    precisions = ("fp32", "bf16") if device.type == "cuda" else ("fp32",)
    for spec in micro_layers.LAYER_HOST_MODELS[:1] if quick else micro_layers.LAYER_HOST_MODELS:
        name = spec.get("zoo") or spec["name"]
        for prec in precisions:
            yield ({"id": f"layer-host/{name}/{prec}", "kind": "layer_host", "model": spec,
                    "batch_size": micro_layers.LAYER_HOST_BATCH, "precision": prec},
                   lambda r, s=spec, p=prec: micro_layers.time_layer_host(s, p, device, r))


def _host_step_cases(device: torch.device, quick: bool) -> Iterator[
        tuple[dict[str, Any], Callable[[int], dict[str, Timing]]]]:
    """The same tiny models' whole training steps, each phase on the host's clock: what
    the host pays per step, with its one backward() call, as a step really runs."""
    precisions = ("fp32", "bf16") if device.type == "cuda" else ("fp32",)
    for spec in micro_layers.LAYER_HOST_MODELS[:1] if quick else micro_layers.LAYER_HOST_MODELS:
        name = spec.get("zoo") or spec["name"]
        for prec in precisions:
            yield ({"id": f"host-step/{name}/{prec}", "kind": "host_step", "model": spec,
                    "batch_size": micro_layers.LAYER_HOST_BATCH, "precision": prec,
                    "optimizer": "adam"},
                   lambda r, s=spec, p=prec: micro_layers.time_host_step(s, p, device, r))


def _graph_cases(device: torch.device, quick: bool, cache: float) -> Iterator[
        tuple[dict[str, Any], Callable[[int], Timing]]]:
    """Small and mid-sized GEMMs and copies replayed from a CUDA graph: device time alone,
    which tells a kernel's own fixed cost apart from the host's cost of issuing it."""
    shapes = [(s, s, s) for s in (64, 256, 512, 1024, 2048, 4096)] + [
        (4096, 2304, 768), (4096, 768, 3072), (8192, 768, 768), (768, 768, 8192)]
    for prec in ("bf16", "tf32"):
        for m, n, k in shapes[:2] if quick else shapes:
            yield ({"id": f"gemm-graph/{prec}/{m}x{n}x{k}", "kind": "gemm", "graph": True,
                    "precision": prec, "m": m, "n": n, "k": k},
                   lambda r, m=m, n=n, k=k, p=prec: micro.time_gemm(m, n, k, p, device, r,
                                                                    graph=True))
    for size in micro.elementwise_sizes(2**28)[:: 3 if quick else 1]:
        yield ({"id": f"elementwise-graph/copy/{size}", "kind": "elementwise", "graph": True,
                "op": "copy", "bytes": size, "dtype": "fp32"},
               lambda r, s=size: micro.time_elementwise("copy", s, device, r, cache,
                                                        graph=True))


def _sdpa_cases(device: torch.device, quick: bool) -> Iterator[
        tuple[dict[str, Any], Callable[[int], dict[str, Timing]]]]:
    """SDPA restricted to each backend in turn, and left to choose (``auto``)."""
    cuda = device.type == "cuda"
    shapes = micro_layers.sdpa_shapes(16384 if cuda else 256)[: 2 if quick or not cuda else None]
    backends = (*micro_layers.SDPA_BACKENDS, None) if cuda else ("flash", "math", None)
    for shape in shapes:
        key = "x".join(str(shape[k]) for k in ("batch", "heads", "kv_heads", "seq", "head_dim"))
        key += "-causal" if shape["causal"] else ""
        for backend in backends:
            name = backend or "auto"
            yield ({"id": f"sdpa/{name}/{key}", "kind": "sdpa", "precision": "bf16",
                    "backend": name, **shape,
                    **({} if backend else
                       {"chosen": micro_layers.default_sdpa_backend(shape, "bf16", device)})},
                   lambda r, s=shape, b=backend: micro_layers.time_sdpa(s, b, device, r))
        if cuda and shape["kv_heads"] == shape["heads"]:
            # attention written out (calibrate: the unfused attention group)
            yield ({"id": f"sdpa/unfused/{key}", "kind": "sdpa", "precision": "bf16",
                    "backend": "unfused", **shape},
                   lambda r, s=shape: micro_layers.time_unfused_attention(s, device, r))
    if cuda:
        yield from _sdpa_fp32_cases(device, quick)


def _sdpa_fp32_cases(device: torch.device, quick: bool) -> Iterator[
        tuple[dict[str, Any], Callable[[int], dict[str, Timing]]]]:
    """fp32 SDPA on a GPU (fp32 models' attention: the efficient and math backends run it
    on the SIMT units, flash and cuDNN take 16-bit inputs only), at 4096 tokens a batch.
    Not fitted yet: calibration keeps its SDPA groups to bf16 until an fp32 group exists."""
    shapes = [s for s in micro_layers.sdpa_shapes(4096) if s["kv_heads"] == s["heads"]]
    for shape in shapes[:1] if quick else shapes[:3]:
        key = "x".join(str(shape[k]) for k in ("batch", "heads", "kv_heads", "seq", "head_dim"))
        key += "-causal" if shape["causal"] else ""
        for backend in ("efficient", "math", None):
            name = backend or "auto"
            yield ({"id": f"sdpa/fp32/{name}/{key}", "kind": "sdpa", "precision": "fp32",
                    "backend": name, **shape},
                   lambda r, s=shape, b=backend: micro_layers.time_sdpa(
                       s, b, device, r, torch.float32))


def _row_kernel_cases(device: torch.device, quick: bool, max_bytes: float,
                      cache: float) -> Iterator[
        tuple[dict[str, Any], Callable[[int], dict[str, Timing]]]]:
    """Norms, softmax, activations and cross-entropy, forward and backward, in bf16."""
    for op in micro_layers.NORM_OPS:
        sizes = (micro_layers.cross_entropy_sizes(max_bytes) if op == "cross_entropy"
                 else micro_layers.kernel_sizes(max_bytes))
        for rows, cols in sizes[::4] if quick else sizes:
            yield ({"id": f"kernel/{op}/{rows}x{cols}", "kind": "row_kernel", "op": op,
                    "rows": rows, "cols": cols, "precision": "bf16"},
                   lambda r, o=op, m=rows, n=cols: micro_layers.time_row_kernel(o, m, n, device, r,
                                                                         cache))
    for op, upcast, compiled in micro_layers.ROW_KERNEL_VARIANTS:
        if compiled and device.type != "cuda":
            continue  # TorchInductor's CPU kernels are not what these cases calibrate
        sizes = micro_layers.kernel_sizes(max_bytes)
        form = "-".join(w for w in (upcast and "upcast", compiled and "compiled") if w)
        for rows, cols in sizes[::4] if quick else sizes:
            yield ({"id": f"kernel/{op}-{form}/{rows}x{cols}", "kind": "row_kernel", "op": op,
                    "rows": rows, "cols": cols, "precision": "bf16",
                    **({"upcast": upcast} if upcast else {}),
                    **({"compiled": True} if compiled else {})},
                   lambda r, o=op, m=rows, n=cols, u=upcast, c=compiled:
                   micro_layers.time_row_kernel(o, m, n, device, r, cache, u, c))


def _adamw_cases(device: torch.device, quick: bool) -> Iterator[
        tuple[dict[str, Any], Callable[[int], Timing]]]:
    """One AdamW step by implementation, from a million to a quarter billion parameters,
    and PyTorch's default Adam over few and many small tensors (its fixed host cost)."""
    # on a CPU up to states past its caches (2**25 parameters: 512 MiB of weight, gradient
    # and moments), which a model's optimizer step streams from DRAM
    sizes = [2**20, 2**24, 2**28] if device.type == "cuda" else [2**16, 2**20, 2**22, 2**25]
    for impl in micro_layers.ADAM_IMPLS:
        for params in sizes[:1] if quick else sizes:
            yield ({"id": f"adamw/{impl}/{params}", "kind": "optimizer", "impl": impl,
                    "params": params, "tensors": 32, "optimizer": "adamw"},
                   lambda r, i=impl, n=params: micro_layers.time_adam(n, i, device, r))
    for tensors in (2, 8, 32, 128, 512)[: 2 if quick else None]:
        yield ({"id": f"adam/default/{tensors}x1024", "kind": "optimizer", "impl": "default",
                "params": 1024 * tensors, "tensors": tensors, "optimizer": "adam"},
               lambda r, t=tensors: micro_layers.time_adam(1024 * t, "default", device, r, t,
                                                           "adam"))


def _batch_norm_cases(device: torch.device, quick: bool, batch: int) -> Iterator[
        tuple[dict[str, Any], Callable[[int], dict[str, Timing]]]]:
    """ResNet-50's batch norms in fp32 and with 16-bit inputs (as autocast runs them)."""
    for prec in ("fp32", "bf16"):
        for n, c, hw in micro_layers.batch_norm_shapes(batch)[: 2 if quick else None]:
            yield ({"id": f"batch_norm/{prec}/{n}x{c}x{hw}x{hw}", "kind": "batch_norm",
                    "precision": prec, "batch": n, "channels": c, "height": hw},
                   lambda r, n=n, c=c, hw=hw, p=prec: micro_layers.time_batch_norm(n, c, hw, p,
                                                                            device, r))


class Deadline:
    """When to stop starting cases (``None``: never), so a lease-bound run still writes."""

    def __init__(self, minutes: float | None) -> None:
        if minutes is not None and not (minutes > 0 and minutes < float("inf")):
            raise InvalidConfig(f"--max-minutes must be a positive number, not {minutes}")
        self.end = None if minutes is None else time.perf_counter() + 60.0 * minutes

    def passed(self) -> bool:
        return self.end is not None and time.perf_counter() > self.end


TIME_LIMIT = "time limit (--max-minutes) reached before this case"


def _run_micro(device: torch.device, repeats: int, quick: bool,
               deadline: Deadline, kinds: set[str] | None = None) -> list[dict[str, Any]]:
    rows = []
    cases = [(case, fn) for case, fn in micro_cases(device, quick)
             if kinds is None or case["kind"] in kinds]
    for i, (case, fn) in enumerate(cases, 1):
        if deadline.passed():
            rows.append({**case, "skipped": TIME_LIMIT})
            continue
        try:
            out = fn(repeats)
        except (RuntimeError, TypeError, ValueError) as exc:  # an op this build lacks
            rows.append({**case, "skipped": f"{type(exc).__name__}: {str(exc)[:200]}"})
            if device.type == "cuda":  # give back what a failed (e.g. out-of-memory) case held
                torch.cuda.empty_cache()
            _progress(i, len(cases), case["id"], None)
            continue
        if isinstance(out, dict):
            for pass_name, timing in out.items():
                rows.append(_timed({**case, "id": f"{case['id']}/{pass_name}",
                                    "pass": pass_name}, timing))
            _progress(i, len(cases), case["id"], next(iter(out.values())).median_s
                      if out else None)
        else:
            rows.append(_timed(case, out))
            _progress(i, len(cases), case["id"], out.median_s)
    return rows


def _run_models(device: torch.device, repeats: int, quick: bool,
                layers: bool, deadline: Deadline) -> list[dict[str, Any]]:
    cases = models.gpu_cases() if device.type == "cuda" else models.cpu_cases()
    if quick:
        cases = [c for c in cases if c.spec.get("zoo") == "mnist-mlp"][:2]
    rows = []
    for i, case in enumerate(cases, 1):
        if deadline.passed():
            rows.append({"id": case.id, "kind": "training_step", "skipped": TIME_LIMIT})
            continue
        try:
            row = models.measure_case(case, device, repeats, layers)
        except torch.OutOfMemoryError:
            rows.append({"id": case.id, "kind": "training_step", "skipped": "out of memory"})
            _progress(i, len(cases), case.id, None)
            continue
        rows.append(row)
        _progress(i, len(cases), case.id, row["step"]["median_s"])
    return rows


def _progress(i: int, total: int, name: str, seconds: float | None) -> None:
    shown = f"{seconds * 1e3:10.3f} ms" if seconds is not None else "   skipped"
    print(f"[{i:3d}/{total}] {name:<48} {shown}", file=sys.stderr, flush=True)


def summary_table(data: dict[str, Any]) -> str:
    """A short table: per kind, how many cases and the fastest and slowest medians."""
    by_kind: dict[str, list[float]] = {}
    for case in data["cases"]:
        if "median_s" in case:
            by_kind.setdefault(case["kind"], []).append(case["median_s"])
        elif "step" in case:
            by_kind.setdefault(case["kind"], []).append(case["step"]["median_s"])
    lines = [f"{data['suite']} suite on {data['device']}: {len(data['cases'])} cases",
             f"{'kind':<16}{'cases':>6}{'fastest (ms)':>15}{'slowest (ms)':>15}"]
    for kind, values in by_kind.items():
        lines.append(f"{kind:<16}{len(values):>6}{min(values) * 1e3:>15.4g}"
                     f"{max(values) * 1e3:>15.4g}")
    return "\n".join(lines)


def run(suite: str, out_dir: str | Path, device_name: str | None = None,
        repeats: int = REPEATS, quick: bool = False, layers: bool = True,
        max_minutes: float | None = None, kinds: list[str] | None = None) -> Path:
    """Measure ``suite`` on this machine and write ``<out_dir>/<suite>.json``; ``kinds``
    keeps only those kinds of micro case."""
    if suite not in results.SUITES:
        raise InvalidConfig(f"unknown suite {suite!r}; use micro or models")
    if repeats < 1:
        raise InvalidConfig("repeats must be at least 1")
    deadline = Deadline(max_minutes)
    device = torch_device()
    profile = resolve_device(device_name, device)
    info = provenance.collect(device)
    started = time.perf_counter()
    if suite == "micro":
        cases = _run_micro(device, repeats, quick, deadline, set(kinds) if kinds else None)
    else:
        cases = _run_models(device, repeats, quick, layers, deadline)
    info["seconds"] = round(time.perf_counter() - started, 1)
    if device.type == "cuda":
        info["clocks_after"] = provenance.gpu_clocks()
    data = {"schema_version": results.SCHEMA_VERSION, "suite": suite, "device": profile.name,
            "quick": quick, **({"kinds": sorted(kinds)} if kinds else {}),
            "provenance": info, "switches": provenance.switches(device),
            "cases": cases}
    path = results.write(Path(out_dir) / f"{suite}.json", data)
    print(summary_table(data))
    return path
