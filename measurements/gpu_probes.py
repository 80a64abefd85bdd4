"""Probes of a GPU that the suites do not cover, each a question one model term asks:

- ``context``: device memory a process holds outside PyTorch's caching allocator (the CUDA
  context, then cuBLAS, cuDNN and attention kernels' modules and workspaces), read with
  cudaMemGetInfo in a fresh process after each first use.
- ``nccl``: the same, for NCCL's communicator on one rank (init, first all-reduce, first
  all-to-all, a second process group): what a communicator costs before any peer.
- ``moe``: one mixture-of-experts layer's forward and backward as Megatron-Core's dropless
  all-to-all dispatcher runs it on one GPU (router, top-k, the routing map's token counts
  copied to the host before the expert products, permute, grouped products, unpermute),
  with and without that host synchronization, with a per-expert loop (SequentialMLP), and
  with balanced routing in one batched product (what gpusim costs): wall time per pass and
  the device's busy time from the profiler.
- ``sdpa32``: fp32 attention per SDPA backend (efficient, math) and written out.
- ``fsdp_reserve``: the caching allocator's reserve (peak reserved over peak allocated) of a
  few Llama-8B-sized blocks trained plainly under autocast and under FSDP2 on one rank
  (its all-gather and reduce-scatter streams keep blocks of their own), resharding after
  forward or not: whether reserved/allocated grows beyond a one-stream run's.

Not calibration data unless a calibration group says so; written for the model terms that
lack a measurement (issues 14, 15, 20).

- ``moe_kernels``: the models suite's MoE layer (moe-blocks), kernel by kernel.
- ``expert_gemms``: the experts' products as Transformer Engine's GroupedLinear issues them
  on Hopper (a cuBLAS GEMM per expert, round-robin on 4 streams), against one batched
  product and a single stream: what gpusim's stack field expert_streams costs.

    python measurements/gpu_probes.py OUT_FILE [context nccl moe sdpa32 moe_kernels
                                                fsdp_reserve expert_gemms]
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

MIB = 2**20


def _used() -> int:
    free, total = torch.cuda.mem_get_info()
    return total - free


def _outside_allocator() -> dict[str, float]:
    torch.cuda.synchronize()
    used = _used()
    reserved = torch.cuda.memory_reserved()
    return {"device_used_mib": used / MIB, "allocator_reserved_mib": reserved / MIB,
            "outside_allocator_mib": (used - reserved) / MIB}


def probe_context() -> dict[str, Any]:
    """Run in a fresh process: each first use's modules and handles, outside the allocator."""
    out: dict[str, Any] = {}
    free, total = torch.cuda.mem_get_info()  # creates the primary context
    out["after_context"] = {"device_used_mib": (total - free) / MIB,
                            "allocator_reserved_mib": 0.0,
                            "outside_allocator_mib": (total - free) / MIB}
    x = torch.ones(1024, device="cuda")
    out["after_first_tensor"] = _outside_allocator()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    out["after_bf16_matmul"] = _outside_allocator()
    f = torch.randn(4096, 4096, device="cuda")
    (f @ f).sum().item()
    out["after_fp32_matmul"] = _outside_allocator()
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).cuda()
    conv(torch.randn(8, 64, 56, 56, device="cuda")).sum().backward()
    out["after_conv_backward"] = _outside_allocator()
    q = torch.randn(2, 16, 2048, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    out["after_sdpa_backward"] = _outside_allocator()
    w = torch.nn.Linear(4096, 4096).cuda()
    opt = torch.optim.AdamW(w.parameters(), fused=True)
    w(torch.randn(16, 4096, device="cuda")).sum().backward()
    opt.step()
    out["after_fused_adamw"] = _outside_allocator()
    del x, a, f
    out["total_mib"] = total / MIB
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def probe_nccl() -> dict[str, Any]:
    """Run in a fresh process: one rank's NCCL communicators, outside the allocator."""
    import torch.distributed as dist
    out: dict[str, Any] = {}
    torch.ones(1, device="cuda")
    out["before_init"] = _outside_allocator()
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                            world_size=1, device_id=torch.device("cuda", 0))
    out["after_init"] = _outside_allocator()
    t = torch.randn(2**20, device="cuda")
    dist.all_reduce(t)
    out["after_first_all_reduce"] = _outside_allocator()
    u = torch.empty_like(t)
    dist.all_to_all_single(u, t)
    out["after_first_all_to_all"] = _outside_allocator()
    group = dist.new_group([0])
    dist.all_reduce(t, group=group)
    out["after_second_group_all_reduce"] = _outside_allocator()
    torch.cuda.synchronize()
    out["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    dist.destroy_process_group()
    return out


# Llama 3 8B's block (hidden 4096, 32 heads of 128, 8 K/V heads, SwiGLU of 14336) at one
# sequence of 8192 tokens: four of them, about a billion parameters.
FSDP_PROBE = {"blocks": 4, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336,
              "batch": 1, "seq": 8192}


class _Block(torch.nn.Module):
    """A Llama block: RMS norms, grouped-query SDPA, SwiGLU."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, hidden // heads
        self.norm1 = torch.nn.RMSNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, (heads + 2 * kv_heads) * self.dim, bias=False)
        self.out = torch.nn.Linear(hidden, hidden, bias=False)
        self.norm2 = torch.nn.RMSNorm(hidden)
        self.up = torch.nn.Linear(hidden, 2 * ffn, bias=False)
        self.down = torch.nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(
            [self.heads * self.dim, self.kv_heads * self.dim, self.kv_heads * self.dim], -1)
        q = q.view(b, s, self.heads, self.dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.dim).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, h))
        gate, up = self.up(self.norm2(x)).chunk(2, -1)
        return x + self.down(F.silu(gate) * up)


def _peaks(model: torch.nn.Module, cfg: dict[str, int], device: torch.device,
           autocast: bool, steps: int = 3) -> dict[str, Any]:
    """Peak allocated, active and reserved over the steps after the first (AdamW, foreach),
    and the allocator's retries: reserved over allocated is the reserve."""
    cuda = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    x = torch.randn(cfg["batch"], cfg["seq"], cfg["hidden"], device=device)
    for step in range(steps):
        if step == 1 and cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if not cuda:
        return {"steps": steps}
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    allocated = stats["allocated_bytes.all.peak"]
    reserved = stats["reserved_bytes.all.peak"]
    return {"allocated_mib": allocated / MIB, "active_mib": stats["active_bytes.all.peak"] / MIB,
            "reserved_mib": reserved / MIB, "reserve": reserved / allocated - 1,
            "alloc_retries": stats["num_alloc_retries"], "segments": stats["segment.all.peak"]}


def probe_fsdp_reserve(cfg: dict[str, int] | None = None) -> dict[str, Any]:
    """Run in a fresh process: the same blocks trained plainly (fp32 weights, autocast),
    then under FSDP2 on a one-rank mesh (bf16 parameters, fp32 reduction), resharding
    after forward and not."""
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    cfg = cfg or FSDP_PROBE
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")

    def blocks() -> torch.nn.Sequential:
        torch.manual_seed(0)
        return torch.nn.Sequential(*[
            _Block(cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["ffn"])
            for _ in range(cfg["blocks"])]).to(device)

    out: dict[str, Any] = {"config": cfg, "plain_autocast": _peaks(blocks(), cfg, device, True)}
    if cuda:
        torch.cuda.empty_cache()
    dist.init_process_group("nccl" if cuda else "gloo",
                            init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                            world_size=1, **({"device_id": device} if cuda else {}))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for reshard in (True, False):
        model = blocks()
        for block in model:
            fully_shard(block, mp_policy=policy, reshard_after_forward=reshard)
        fully_shard(model, mp_policy=policy, reshard_after_forward=reshard)
        out[f"fsdp2_reshard_{str(reshard).lower()}"] = _peaks(model, cfg, device, False)
        del model
        if cuda:
            torch.cuda.empty_cache()
    dist.destroy_process_group()
    return out


def _in_child(name: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, __file__, "--child", name], capture_output=True,
                          text=True, env=env, timeout=240)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# Qwen3-30B-A3B's MoE layer (hidden 2048, 128 experts of 768, top 8) at 4096 tokens:
# the layer behind the Megatron-Bridge rows that miss by ~2 ms per MoE layer-pass.
MOE = {"tokens": 4096, "hidden": 2048, "experts": 128, "ffn": 768, "top_k": 8}


class MoELayer(torch.nn.Module):
    def __init__(self, hidden: int, experts: int, ffn: int, top_k: int, mode: str) -> None:
        super().__init__()
        self.e, self.k, self.mode = experts, top_k, mode
        self.router = torch.nn.Parameter(torch.randn(experts, hidden) * hidden ** -0.5)
        self.fc1 = torch.nn.Parameter(torch.randn(experts, hidden, 2 * ffn) * hidden ** -0.5)
        self.fc2 = torch.nn.Parameter(torch.randn(experts, ffn, hidden) * ffn ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        # router in fp32, softmax after top-k as Qwen3 (normalized top-k probabilities)
        logits = x.float() @ self.router.float().t()
        top, idx = torch.topk(logits, self.k, dim=1)
        if self.mode == "balanced":
            idx = (torch.arange(t * self.k, device=x.device) % self.e).view(t, self.k)
        probs = torch.softmax(top, dim=1)
        routing = torch.zeros(t, self.e, dtype=torch.bool, device=x.device).scatter(1, idx, True)
        dense_probs = torch.zeros(t, self.e, dtype=probs.dtype, device=x.device).scatter(
            1, idx, probs)
        counts = routing.sum(dim=0)
        if self.mode in ("sync", "sequential"):
            counts_host = counts.cpu().tolist()  # the dispatcher's device-to-host sync
        token_of = torch.arange(t, device=x.device).unsqueeze(0).expand(self.e, -1)
        order = token_of.masked_select(routing.t().contiguous())  # tokens in expert order
        permuted = x.index_select(0, order)
        permuted_probs = dense_probs.t().contiguous().masked_select(routing.t().contiguous())
        if self.mode == "balanced":
            per = permuted.view(self.e, -1, x.shape[1])
            h = torch.bmm(per, self.fc1.to(x.dtype))
            gate, up = h.chunk(2, dim=-1)
            y = torch.bmm(F.silu(gate) * up, self.fc2.to(x.dtype)).view(-1, x.shape[1])
        elif self.mode == "sequential":
            outs = []
            for e, chunk in enumerate(torch.split(permuted, counts_host)):
                gate, up = (chunk @ self.fc1[e].to(x.dtype)).chunk(2, dim=-1)
                outs.append((F.silu(gate) * up) @ self.fc2[e].to(x.dtype))
            y = torch.cat(outs)
        else:
            if self.mode == "sync":
                offs = torch.tensor(counts_host, device=x.device).cumsum(0).to(torch.int32)
            else:
                offs = counts.cumsum(0).to(torch.int32)
            h = torch._grouped_mm(permuted, self.fc1.to(x.dtype), offs=offs)
            gate, up = h.chunk(2, dim=-1)
            y = torch._grouped_mm((F.silu(gate) * up).contiguous(), self.fc2.to(x.dtype),
                                  offs=offs)
        y = y * permuted_probs.unsqueeze(1).to(y.dtype)
        return torch.zeros_like(x).index_add(0, order, y)


def _median_wall(fn: Any, warmup: int = 5, repeats: int = 20) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return samples


def _device_busy(fn: Any, passes: int = 3) -> tuple[float, int]:
    """Seconds per pass the device spent in kernels and copies, and launches per pass."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(passes):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.device_time for e in events) * 1e-6
    return busy / passes, len(events) // passes


def _moe_row(tokens: int, mode: str) -> dict[str, Any]:
    cfg = MOE
    layer = MoELayer(cfg["hidden"], cfg["experts"], cfg["ffn"], cfg["top_k"], mode).cuda()
    x = torch.randn(tokens, cfg["hidden"], device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    grad = torch.randn_like(x)

    def fwd() -> Any:
        return layer(x)

    def fwd_bwd() -> None:
        layer(x).backward(grad)

    row: dict[str, Any] = {**cfg, "tokens": tokens, "mode": mode}
    try:
        for name, fn in (("forward", fwd), ("forward_backward", fwd_bwd)):
            wall = _median_wall(fn)
            busy, launches = _device_busy(fn)
            # the host's time to issue the pass: it returns before the device finishes,
            # except past a synchronization
            torch.cuda.synchronize()
            issue = []
            for _ in range(10):
                start = time.perf_counter()
                fn()
                issue.append(time.perf_counter() - start)
                torch.cuda.synchronize()
            row[name] = {"wall_median_s": statistics.median(wall),
                         "wall_p10_s": sorted(wall)[len(wall) // 10],
                         "device_busy_s": busy, "launches": launches,
                         "host_issue_median_s": statistics.median(issue)}
    except Exception as exc:  # record what this torch lacks, and go on
        row["error"] = f"{type(exc).__name__}: {exc}"[:500]
    return row


def probe_moe() -> dict[str, Any]:
    torch.manual_seed(0)
    rows = []
    for tokens in (MOE["tokens"], 2 * MOE["tokens"]):
        for mode in ("balanced", "nosync", "sync", "sequential"):
            rows.append(_moe_row(tokens, mode))
            print(json.dumps(rows[-1]), file=sys.stderr)
            torch.cuda.empty_cache()
    return {"layers": rows}


def _kernel_table(prof: Any, passes: int) -> list[dict[str, Any]]:
    rows = [e for e in prof.key_averages() if e.device_time_total > 0
            and e.device_type.name != "CPU"]
    rows.sort(key=lambda e: -e.device_time_total)
    return [{"name": e.key[:160], "calls": e.count / passes,
             "seconds": e.device_time_total * 1e-6 / passes} for e in rows]


def probe_moe_kernels() -> dict[str, Any]:
    """The models suite's MoE layer (gpusim's own costing of it, torch_model._MoE) in the
    moe-blocks case, forward and backward under bf16 autocast, kernel by kernel."""
    from torch.profiler import ProfilerActivity, profile

    from gpusim.measure import models
    from gpusim.measure.torch_model import layer_module
    from gpusim.workload.formats import model_from_spec
    from gpusim.workload.moe import MoE as MoELayerSpec
    spec = {**models.MOE_BLOCKS_GPU, "seq_len": 4096}
    layer = next(x for x in model_from_spec(spec).layers if isinstance(x, MoELayerSpec))
    mod = layer_module(layer).cuda()
    out: dict[str, Any] = {"layer": layer.name}
    passes = 5
    for batch in (1, 2):
        x = torch.randn(batch, layer.rows, layer.hidden, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True)
        grad = torch.randn_like(x)
        for _ in range(3):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = mod(x)
            y.backward(grad)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as fwd_prof:
            ys = []
            for _ in range(passes):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    ys.append(mod(x))
            torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as bwd_prof:
            for y in ys:
                y.backward(grad)
            torch.cuda.synchronize()
        out[f"b{batch}"] = {"forward": _kernel_table(fwd_prof, passes),
                            "backward": _kernel_table(bwd_prof, passes)}
        del ys, x, grad
        torch.cuda.empty_cache()
    return out


def _events_time(fn: Any, warmup: int = 3, repeats: int = 15) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(samples)


def _sdpa32_row(b: int, h: int, s: int, d: int, causal: bool, backend: str) -> dict[str, Any]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    q, k, v = (torch.randn(b, h, s, d, device="cuda", requires_grad=True) for _ in range(3))
    grad = torch.randn(b, h, s, d, device="cuda")
    above = torch.ones(s, s, device="cuda", dtype=torch.bool).triu(1)

    def fwd() -> torch.Tensor:
        if backend == "unfused":
            scores = (q @ k.transpose(-1, -2)) * d ** -0.5
            if causal:
                scores = scores.masked_fill(above, float("-inf"))
            return torch.softmax(scores, dim=-1) @ v
        with sdpa_kernel(backends[backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    row: dict[str, Any] = {"batch": b, "heads": h, "seq": s, "head_dim": d, "causal": causal,
                           "backend": backend, "precision": "fp32",
                           "allow_tf32": torch.backends.cuda.matmul.allow_tf32}
    try:
        row["forward_s"] = _events_time(fwd)
        row["forward_backward_s"] = _events_time(lambda: fwd().backward(grad))
    except Exception as exc:  # record what this backend refuses, and go on
        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def probe_sdpa32() -> dict[str, Any]:
    rows = []
    for shape in ((16, 12, 128, 64, False), (8, 12, 512, 64, False), (4, 12, 1024, 64, True),
                  (2, 16, 2048, 128, True), (4, 16, 1024, 64, False)):
        for backend in ("efficient", "math", "unfused"):
            rows.append(_sdpa32_row(*shape, backend))
        torch.cuda.empty_cache()
    return {"cases": rows}


def _expert_gemms(experts: int, m: int, n: int, k: int, streams: int) -> dict[str, Any]:
    """One product per expert as Transformer Engine's GroupedLinear runs it on Hopper
    (multi_stream_cublas_gemm: a cuBLAS GEMM per expert, round-robin on ``streams`` streams,
    joined by events), against one batched product and one stream."""
    a = torch.randn(experts, m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(experts, k, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(experts, m, n, device="cuda", dtype=torch.bfloat16)
    pool = [torch.cuda.Stream() for _ in range(streams)]

    def batched() -> None:
        torch.bmm(a, w, out=out)

    def one_stream() -> None:
        for e in range(experts):
            torch.mm(a[e], w[e], out=out[e])

    def round_robin() -> None:
        main = torch.cuda.current_stream()
        for s in pool:
            s.wait_stream(main)
        for e in range(experts):
            with torch.cuda.stream(pool[e % streams]):
                torch.mm(a[e], w[e], out=out[e])
        for s in pool:
            main.wait_stream(s)

    row: dict[str, Any] = {"experts": experts, "m": m, "n": n, "k": k, "streams": streams,
                           "flops": 2.0 * experts * m * n * k}
    for name, fn in (("batched", batched), ("one_stream", one_stream),
                     ("round_robin", round_robin)):
        row[f"{name}_s"] = _events_time(fn)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):
            fn()
        row[f"{name}_host_s"] = (time.perf_counter() - start) / 10  # issue time, queue ahead
        torch.cuda.synchronize()
    return row


def probe_expert_gemms() -> dict[str, Any]:
    """Experts' products per local-expert count and rows per expert (the Megatron MoE runs:
    Qwen3-30B at EP 8/16, Qwen3-235B at EP 8/32, DeepSeek-V3 at EP 64), bf16."""
    rows = []
    for experts, m, n, k in ((16, 2048, 1536, 2048), (8, 4096, 1536, 2048),
                             (16, 512, 3072, 4096), (4, 4096, 3072, 4096),
                             (4, 4096, 4096, 7168), (16, 256, 1536, 2048)):
        rows.append(_expert_gemms(experts, m, n, k, 4))
        torch.cuda.empty_cache()
    return {"cases": rows}


def main() -> None:
    if sys.argv[1] == "--child":
        fn = {"context": probe_context, "nccl": probe_nccl,
              "fsdp_reserve": probe_fsdp_reserve}[sys.argv[2]]
        print(json.dumps(fn()))
        return
    out_file = Path(sys.argv[1])
    wanted = sys.argv[2:] or ["context", "nccl", "moe", "sdpa32"]
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for name in wanted:
        start = time.perf_counter()
        result[name] = (_in_child(name) if name in ("context", "nccl", "fsdp_reserve")
                        else {"moe": probe_moe, "sdpa32": probe_sdpa32,
                              "moe_kernels": probe_moe_kernels,
                              "expert_gemms": probe_expert_gemms}[name]())
        print(f"{name}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
        out_file.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
