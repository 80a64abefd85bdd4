"""Micro cases at the level of PyTorch's layers: SDPA per backend, norms and activations,
batch norm, torch.optim's step, and what the host pays to call each kind of layer.

Each times what a training step runs through PyTorch's own functions, so calibration can fit
a kernel family's bandwidth or a layer kind's host cost on it (see calibrate/fit.py).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F

from gpusim.measure.micro import TORCH_DTYPES, rotated, time_forward_backward
from gpusim.measure.timing import Timing, time_call

SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")


def sdpa_shapes(tokens: int) -> list[dict[str, Any]]:
    """(batch, heads, kv_heads, seq, head_dim, causal) at ``tokens`` tokens per batch: the
    sequence lengths, head sizes and grouped-query layouts of today's models."""
    rows = [(16, 16, 512, 64, False), (16, 16, 1024, 64, True), (32, 32, 2048, 128, True),
            (32, 8, 2048, 128, True), (32, 8, 4096, 128, True), (32, 8, 8192, 128, True),
            (16, 16, 2048, 64, False), (32, 32, 4096, 128, False), (64, 8, 4096, 128, True)]
    return [{"batch": max(1, tokens // s), "heads": h, "kv_heads": kv, "seq": s,
             "head_dim": d, "causal": c} for h, kv, s, d, c in rows]


def sdpa_backend_chosen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                        gqa: bool, dropout: float = 0.0) -> str:
    """The backend PyTorch's SDPA dispatch picks for these inputs (its own choice function),
    strides, dtype and dropout included."""
    try:
        from torch.nn.attention import SDPBackend
        chosen = torch._fused_sdp_choice(q, k, v, dropout_p=dropout, is_causal=causal,
                                         enable_gqa=gqa)
        names = {int(b.value): b.name for b in SDPBackend.__members__.values()}
        return {"FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "efficient",
                "CUDNN_ATTENTION": "cudnn", "MATH": "math"}.get(names.get(int(chosen), ""),
                                                                 str(chosen))
    except (AttributeError, RuntimeError, TypeError, ValueError) as exc:
        return f"unknown ({type(exc).__name__})"


def default_sdpa_backend(shape: dict[str, Any], precision: str, device: torch.device) -> str:
    """The backend SDPA picks for an attention shape (``kv_heads`` < ``heads``: GQA)."""
    b, s, d = shape["batch"], shape["seq"], shape["head_dim"]
    kv = shape.get("kv_heads", shape["heads"])
    dtype = TORCH_DTYPES[precision]
    q = torch.empty(b, shape["heads"], s, d, device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.empty(b, kv, s, d, device=device, dtype=dtype, requires_grad=True)
            for _ in range(2))
    return sdpa_backend_chosen(q, k, v, shape["causal"], kv != shape["heads"])


def time_sdpa(shape: dict[str, Any], backend: str | None, device: torch.device,
              repeats: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, Timing]:
    """Forward and backward of SDPA (bf16 unless ``dtype`` says) restricted to one backend
    (``None``: PyTorch's own choice), with grouped-query attention when ``kv_heads`` <
    ``heads``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    kinds = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    b, s, d = shape["batch"], shape["seq"], shape["head_dim"]
    gqa = shape["kv_heads"] != shape["heads"]
    q = torch.randn(b, shape["heads"], s, d, device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(b, shape["kv_heads"], s, d, device=device, dtype=dtype,
                        requires_grad=True) for _ in range(2))

    def forward() -> Any:
        ctx = sdpa_kernel([kinds[backend]]) if backend else contextlib.nullcontext()
        with ctx:
            return F.scaled_dot_product_attention(q, k, v, is_causal=shape["causal"],
                                                  enable_gqa=gqa)

    return time_forward_backward(forward, [q, k, v], device, repeats)


def time_unfused_attention(shape: dict[str, Any], device: torch.device,
                           repeats: int) -> dict[str, Timing]:
    """Forward and backward of bf16 attention written out in PyTorch, as FlashAttention's
    benchmarks time their "Pytorch" baseline and older models run it: the scaled QK^T
    product (baddbmm), a causal mask added where causal, softmax, the product with V, and
    the heads merged back into (batch, seq, heads x dim). No grouped-query shapes."""
    b, h, s, d = shape["batch"], shape["heads"], shape["seq"], shape["head_dim"]
    q, k, v = (torch.randn(b * h, s, d, device=device, dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    mask = (torch.full((s, s), -10000.0, device=device, dtype=torch.bfloat16).triu(1)
            if shape["causal"] else None)

    def forward() -> Any:
        scores = torch.baddbmm(torch.empty(b * h, s, s, device=device, dtype=q.dtype), q,
                               k.transpose(1, 2), beta=0.0, alpha=d ** -0.5)
        if mask is not None:
            scores = scores + mask
        out = torch.bmm(torch.softmax(scores, dim=-1), v)
        return out.view(b, h, s, d).transpose(1, 2).reshape(b, s, h * d)

    return time_forward_backward(forward, [q, k, v], device, repeats)


NORM_OPS = ("layer_norm", "rms_norm", "softmax", "gelu", "silu_mul", "cross_entropy")


def kernel_sizes(max_bytes: float) -> list[tuple[int, int]]:
    """(rows, columns) from a few KB to about 1 GB of bf16 input: columns as hidden sizes and
    vocabularies use them, rows as token counts."""
    out = []
    for cols in (1024, 4096, 8192):
        for rows in (16, 256, 4096, 16384, 65536):
            if rows * cols * 2 <= max_bytes:
                out.append((rows, cols))
    return out


def cross_entropy_sizes(max_bytes: float) -> list[tuple[int, int]]:
    """(tokens, vocabulary) as language models meet them."""
    return [(t, v) for v in (32000, 50257, 128256) for t in (512, 2048, 8192)
            if t * v * 4 <= max_bytes]


# Row kernels also timed as frameworks write them in Python ops (the RMS norm that upcasts,
# as torchtitan's of 2024 and Hugging Face's: upcast "cast_back") and under torch.compile
# (TorchInductor's generated kernels): (op, upcast, compiled). Compiled cases run on CUDA.
ROW_KERNEL_VARIANTS = (("rms_norm", "cast_back", False), ("rms_norm", "cast_back", True),
                       ("silu_mul", "", True))


def time_row_kernel(op: str, rows: int, cols: int, device: torch.device,
                    repeats: int, cache_bytes: float, upcast: str = "",
                    compiled: bool = False) -> dict[str, Timing]:
    """A bf16 row-wise kernel, forward and backward, as eager PyTorch runs it: layer and RMS
    norm with a weight, softmax, tanh-GELU, SwiGLU's silu(a) * b, and cross-entropy (bf16
    logits cast to fp32, then log-softmax and NLL, as autocast does). ``upcast``
    "cast_back": the RMS norm written as x.float(), pow, mean, rsqrt, multiply, cast back,
    times the weight; ``compiled``: the function under torch.compile."""
    dtype = torch.bfloat16
    width = 2 * cols if op == "silu_mul" else cols
    weight = torch.randn(cols, device=device, dtype=dtype, requires_grad=True)
    target = torch.randint(0, cols, (rows,), device=device)

    def fn(x: torch.Tensor) -> torch.Tensor:
        if op == "layer_norm":
            return F.layer_norm(x, (cols,), weight)
        if op == "rms_norm" and upcast:
            up = x.float()
            return (up * torch.rsqrt(up.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) \
                * weight
        if op == "rms_norm":
            return F.rms_norm(x, (cols,), weight)
        if op == "softmax":
            return torch.softmax(x, dim=-1)
        if op == "gelu":
            return F.gelu(x, approximate="tanh")
        if op == "silu_mul":
            a, b = x.chunk(2, dim=-1)
            return F.silu(a) * b
        return F.cross_entropy(x.float(), target)

    sets = rotated(lambda: torch.randn(rows, width, device=device, dtype=dtype,
                                        requires_grad=True), 3 * rows * width * 2, cache_bytes)
    turn = {"i": 0}
    run = torch.compile(fn, fullgraph=True) if compiled else fn

    def forward() -> Any:
        turn["i"] = (turn["i"] + 1) % len(sets)
        return run(sets[turn["i"]])

    return time_forward_backward(forward, [weight, *sets], device, repeats)


ADAM_IMPLS = ("fused", "foreach", "for-loop")


def time_adam(params: int, impl: str, device: torch.device, repeats: int, tensors: int = 32,
              optimizer: str = "adamw") -> Timing:
    """One Adam or AdamW step over ``params`` fp32 parameters in ``tensors`` tensors (weight,
    gradient and two moments: 16 bytes read and 12 written per parameter), by
    implementation (``default``: PyTorch's own choice, as a training script gets it)."""
    per = max(1, params // tensors)
    weights = [torch.randn(per, device=device, requires_grad=True) for _ in range(tensors)]
    for w in weights:
        w.grad = torch.randn_like(w)
    kwargs: dict[str, Any] = ({} if impl == "default" else
                              {"fused": impl == "fused", "foreach": impl == "foreach"})
    cls = torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam
    opt = cls(weights, lr=1e-4, **kwargs)
    return time_call(opt.step, device, repeats=repeats)


def batch_norm_shapes(batch: int) -> list[tuple[int, int, int]]:
    """(batch, channels, height = width) of ResNet-50's batch norms."""
    return [(batch, c, hw) for c, hw in ((64, 112), (64, 56), (256, 56), (128, 28),
                                         (512, 28), (256, 14), (1024, 14), (512, 7),
                                         (2048, 7))]


def time_batch_norm(batch: int, channels: int, hw: int, precision: str, device: torch.device,
                    repeats: int) -> dict[str, Timing]:
    """Training-mode BatchNorm2d on an NCHW activation, forward and backward; in bf16 or fp16
    the input is 16-bit and the weights fp32, as under autocast (which leaves batch norm to
    run on its input's type)."""
    norm = torch.nn.BatchNorm2d(channels).to(device)
    dtype = torch.float32 if precision == "fp32" else TORCH_DTYPES[precision]
    x = torch.randn(batch, channels, hw, hw, device=device, dtype=dtype, requires_grad=True)
    return time_forward_backward(lambda: norm(x), [norm.weight, norm.bias, x], device,
                                 repeats)


# Tiny models whose every layer kind the zoo uses appears at a size too small to keep the
# device busy: each layer's forward and backward, timed alone, is then the host's cost of
# calling it (Python, autograd and autocast, and dispatching its kernels).
LAYER_HOST_MODELS: list[dict[str, Any]] = [
    {"zoo": "mnist-mlp"},
    {"zoo": "resnet50", "image_size": 64},
    {"name": "gpt-tiny", "seq_len": 16, "transformer": {
        "layers": 2, "hidden": 64, "heads": 2, "vocab": 512, "dropout": True}},
    {"name": "bert-tiny", "seq_len": 16, "transformer": {
        "layers": 2, "hidden": 64, "heads": 2, "vocab": 512, "kind": "encoder",
        "type_vocab": 2, "dropout": True, "fused_attention": False}},
    {"name": "llama-tiny", "seq_len": 16, "transformer": {
        "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128,
        "vocab": 512, "norm": "rmsnorm", "activation": "swiglu", "positions": "rotary",
        "tied_embeddings": False, "bias": False}},
]


LAYER_HOST_BATCH = 2  # batch norm needs two values per channel to train


def time_layer_host(spec: dict[str, Any], precision: str, device: torch.device,
                    repeats: int) -> dict[str, Timing]:
    """Every layer of a tiny model at a batch of two, forward and backward alone, as the
    models suite times layers: {"<layer>/<forward|backward>": timing}."""
    from gpusim.measure import models  # the models suite's own per-layer timing
    from gpusim.measure.torch_model import Network
    from gpusim.workload.formats import model_from_spec

    case = models.ModelCase(spec, LAYER_HOST_BATCH, precision)
    models.set_precision_flags(precision, device)
    torch.manual_seed(0)
    net = Network(model_from_spec(spec), LAYER_HOST_BATCH, device, inplace=False)
    out = {}
    for row in models.measure_layers(net, case, device, repeats):
        for phase in ("forward", "backward"):
            if phase in row:
                out[f"{row['layer']}/{phase}"] = Timing(**row[phase])
    return out


HOST_STEP_PHASES = ("zero_grad", "forward", "backward", "optimizer")


def time_host_step(spec: dict[str, Any], precision: str, device: torch.device,
                   repeats: int) -> dict[str, Timing]:
    """A tiny model's whole training step (zero_grad, forward with the loss, backward(),
    PyTorch's default Adam), each phase timed on the host's clock: at this size the device
    is idle between launches, so this is what the host pays per step, phase by phase, with
    one backward() call spread over every layer as in a real step."""
    import time

    from gpusim.measure import models
    from gpusim.measure.timing import synchronize
    from gpusim.measure.torch_model import Network
    from gpusim.workload.formats import model_from_spec

    models.set_precision_flags(precision, device)
    torch.manual_seed(0)
    net = Network(model_from_spec(spec), LAYER_HOST_BATCH, device, inplace=True)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    clock = time.perf_counter

    def step() -> list[float]:
        marks = [clock()]
        opt.zero_grad(set_to_none=True)
        marks.append(clock())
        with models.autocast(precision, device):
            loss = net()
        marks.append(clock())
        loss.backward()
        marks.append(clock())
        opt.step()
        marks.append(clock())
        return marks

    for _ in range(5):
        step()
    samples: dict[str, list[float]] = {p: [] for p in HOST_STEP_PHASES}
    for _ in range(repeats):
        synchronize(device)
        marks = step()
        for phase, a, b in zip(HOST_STEP_PHASES, marks, marks[1:], strict=False):
            samples[phase].append(b - a)
    synchronize(device)
    return {phase: Timing.of(values) for phase, values in samples.items()}


def linear_shapes(tokens: int) -> list[tuple[int, int, int]]:
    """(tokens, in, out) of transformer projections: Llama-3 8B's and 70B's q/k/v, output,
    gate/up and down, at ``tokens`` tokens."""
    return [(tokens, i, o) for i, o in ((4096, 6144), (4096, 4096), (4096, 28672),
                                        (14336, 4096), (8192, 10240), (8192, 57344),
                                        (28672, 8192), (2048, 2048))]


def time_linear(tokens: int, in_features: int, out_features: int, device: torch.device,
                repeats: int, cache_bytes: float) -> dict[str, Timing]:
    """A bf16 linear layer as training runs it: the forward product x W^T, and backward's
    input gradient dy W and weight gradient dy^T x (the three layouts cuBLAS meets)."""
    weight = torch.randn(out_features, in_features, device=device, dtype=torch.bfloat16,
                         requires_grad=True)
    sets = rotated(lambda: torch.randn(tokens, in_features, device=device,
                                       dtype=torch.bfloat16, requires_grad=True),
                   2 * tokens * (in_features + out_features), cache_bytes)
    turn = {"i": 0}

    def forward() -> Any:
        turn["i"] = (turn["i"] + 1) % len(sets)
        return F.linear(sets[turn["i"]], weight)

    return time_forward_backward(forward, [weight, *sets], device, repeats)
