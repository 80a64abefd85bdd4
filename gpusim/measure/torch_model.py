"""PyTorch modules built from a gpusim model, so the measured workload is the predicted one.

Each gpusim layer becomes one small torch module (``layer_module``) and ``Network`` runs them
in the model's order. The flat layer list names no data flow, so two tensors are carried: the
stream ``x`` and the residual ``skip``. A block boundary or a residual add sets ``skip``; a
convolution whose input shape matches ``skip`` rather than ``x`` (a ResNet downsample) reads
and writes ``skip``, and so does the batch norm after it. Which tensor a residual adds changes
where autograd sums a gradient, not which kernels run. Attention scores are not scaled: the
model lists no scaling kernel, and scaling does not change the time of the kernels it lists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpusim.errors import InvalidModel
from gpusim.workload.attention import Attention, CrossEntropy, Embedding
from gpusim.workload.layers import Conv2d, Elementwise, Layer, Linear
from gpusim.workload.model import Model
from gpusim.workload.moe import MoE

DROPOUT_P = 0.1


class _Linear(nn.Linear):
    def __init__(self, layer: Linear) -> None:
        super().__init__(layer.in_features, layer.out_features, bias=layer.bias)
        self.rows = layer.rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        shape = (n, self.rows, self.in_features) if self.rows > 1 else (n, self.in_features)
        return super().forward(x.reshape(shape))


class _Elementwise(nn.Module):
    def __init__(self, layer: Elementwise, inplace: bool) -> None:
        super().__init__()
        self.op, self.args = layer.op, layer.args
        self.inplace = inplace and layer.saves == 0
        if self.op == "batch_norm":
            self.norm: nn.Module = nn.BatchNorm2d(layer.args[0])
        elif self.op == "layer_norm":
            self.norm = nn.LayerNorm(layer.args[0])
        elif self.op == "rms_norm":
            self.norm = nn.RMSNorm(layer.args[0])
        elif self.op not in ("relu", "gelu", "swiglu", "dropout", "softmax", "add", "maxpool",
                             "avgpool", "adaptive_avgpool"):
            raise InvalidModel(f"layer {layer.name}: no PyTorch op for elementwise kind "
                               f"{self.op or 'unnamed'!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        op, args = self.op, self.args
        if op in ("batch_norm", "layer_norm", "rms_norm"):
            return self.norm(x)
        if op == "relu":
            return F.relu(x, inplace=self.inplace)
        if op == "gelu":
            return F.gelu(x)
        if op == "swiglu":
            gate, up = x.chunk(2, dim=-1)
            return F.silu(gate) * up
        if op == "dropout":
            return F.dropout(x, DROPOUT_P, training=True)
        if op == "softmax":
            return F.softmax(x, dim=-1)
        if op == "maxpool":
            return F.max_pool2d(x, args[0], args[1], args[2])
        if op == "avgpool":
            return F.avg_pool2d(x, args[0], args[1], args[2])
        return F.adaptive_avg_pool2d(x, args[0])


class _Attention(nn.Module):
    """Attention over the packed output of the QKV projection (heads, then K and V heads)."""

    def __init__(self, layer: Attention) -> None:
        super().__init__()
        self.layer = layer
        if layer.qk_norm:  # Qwen3's per-head norms of the queries and keys
            self.q_norm = nn.Parameter(torch.ones(layer.head_dim))
            self.k_norm = nn.Parameter(torch.ones(layer.head_dim))
        # rotary embeddings as Hugging Face applies them (the pytorch stack's rotate_half):
        # cos and sin tables of the rotated dimensions, in the activations' type
        d = layer.rotary_dim
        inv_freq = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / max(d, 1))
        angles = torch.outer(torch.arange(layer.seq, dtype=torch.float32), inv_freq)
        self.cos = torch.cat((angles, angles), dim=-1).cos()
        self.sin = torch.cat((angles, angles), dim=-1).sin()
        self._tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}
        # The SDPA backend PyTorch picked for the tensors this layer really passes (views of
        # the packed projection, autocast's dtype, dropout), which can differ from the
        # micro suite's contiguous inputs; recorded at the first call.
        self.sdpa_backend = ""

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        a = self.layer
        kv = a.kv_heads or a.heads
        n = qkv.shape[0]
        parts = qkv.reshape(n, a.seq, a.heads + 2 * kv, a.head_dim).transpose(1, 2)
        q, k, v = parts.split([a.heads, kv, kv], dim=1)
        if a.qk_norm:
            q = F.rms_norm(q, (a.head_dim,), self.q_norm)
            k = F.rms_norm(k, (a.head_dim,), self.k_norm)
        if a.rotary_dim:
            q, k = self._rotate(q), self._rotate(k)
        p = DROPOUT_P if a.dropout else 0.0
        if a.fused and not self.sdpa_backend and not torch.compiler.is_compiling():
            from gpusim.measure.micro_layers import sdpa_backend_chosen
            self.sdpa_backend = sdpa_backend_chosen(q, k, v, a.causal, kv != a.heads, p)
        if a.fused:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=a.causal,
                                                 enable_gqa=kv != a.heads)
        else:
            scores = torch.matmul(q, k.transpose(-1, -2))
            if a.scale_and_mask:  # as hand-written BERT attention: two passes of their own
                scores = scores / math.sqrt(a.head_dim)
                mask = torch.zeros(n, 1, 1, a.seq, device=scores.device, dtype=scores.dtype)
                scores = scores + mask  # a padding mask, broadcast over heads and queries
            probs = F.softmax(scores, dim=-1)
            if p:
                probs = F.dropout(probs, p, training=True)
            out = torch.matmul(probs, v)
        return out.transpose(1, 2).reshape(n, a.seq, a.heads * a.head_dim)

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:
        """x * cos + rotate_half(x) * sin on the rotated dimensions (the rest passed on)."""
        if x.dtype not in self._tables:  # the tables moved and cast once, not every call
            self._tables[x.dtype] = (self.cos.to(x.device, x.dtype),
                                     self.sin.to(x.device, x.dtype))
        cos, sin = self._tables[x.dtype]
        d = self.layer.rotary_dim
        rot, rest = (x, None) if d == x.shape[-1] else (x[..., :d], x[..., d:])
        x1, x2 = rot[..., : d // 2], rot[..., d // 2:]
        out = rot * cos + torch.cat((-x2, x1), dim=-1) * sin
        return out if rest is None else torch.cat((out, rest), dim=-1)


class _MoE(nn.Module):
    """A mixture of experts as gpusim costs it (gpusim.workload.moe): the router's product and
    softmax, the copies gathered into expert order, each expert's products as one batched
    product over its tokens, the gated activation, the copies weighted and summed back, and
    shared experts beside them. Routing is balanced by construction (copy j of token t goes
    to expert (t * k + j) mod E): what the load-balancing loss aims at and what the model
    assumes, so both time the same work; the router's scores still weight the copies."""

    def __init__(self, layer: MoE) -> None:
        super().__init__()
        self.layer = layer
        h, e, up = layer.hidden, layer.experts, (2 if layer.gated else 1) * layer.ffn
        self.router = nn.Linear(h, e, bias=False)
        self.up = nn.Parameter(torch.randn(e, h, up) * 0.02)
        self.down = nn.Parameter(torch.randn(e, layer.ffn, h) * 0.02)
        self.shared_up = self.shared_down = None
        if layer.shared_ffn:
            self.shared_up = nn.Linear(h, (2 if layer.gated else 1) * layer.shared_ffn,
                                       bias=False)
            self.shared_down = nn.Linear(layer.shared_ffn, h, bias=False)

    def _act(self, x: torch.Tensor) -> torch.Tensor:
        if not self.layer.gated:
            return F.gelu(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.layer
        n = x.shape[0]
        tokens = x.reshape(-1, a.hidden)
        count = tokens.shape[0]
        scores = self.router(tokens).float().softmax(dim=-1)
        expert = (torch.arange(count * a.top_k, device=x.device) % a.experts).view(count,
                                                                                 a.top_k)
        weights = scores.gather(1, expert).to(tokens.dtype)
        order = expert.flatten().argsort(stable=True)
        copies = tokens.repeat_interleave(a.top_k, dim=0)[order]
        hidden = self._act(torch.bmm(copies.view(a.experts, -1, a.hidden),
                                     self.up.to(copies.dtype)))
        out = torch.bmm(hidden, self.down.to(hidden.dtype)).reshape(-1, a.hidden)
        back = torch.empty_like(out).index_copy(0, order, out)
        y = (back.view(count, a.top_k, a.hidden) * weights.unsqueeze(-1)).sum(dim=1)
        if self.shared_up is not None and self.shared_down is not None:
            y = y + self.shared_down(self._act(self.shared_up(tokens)))
        return y.view(n, a.rows, a.hidden)


class _CrossEntropy(nn.Module):
    def __init__(self, layer: CrossEntropy) -> None:
        super().__init__()
        self.classes = layer.classes

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, self.classes), target)


def layer_module(layer: Layer, inplace: bool = False) -> nn.Module:
    """The PyTorch module that runs ``layer``'s forward and backward kernels."""
    if isinstance(layer, Linear):
        return _Linear(layer)
    if isinstance(layer, Conv2d):
        return nn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel, layer.stride,
                         layer.padding, groups=layer.groups, bias=layer.bias)
    if isinstance(layer, Elementwise):
        return _Elementwise(layer, inplace)
    if isinstance(layer, Attention):
        return _Attention(layer)
    if isinstance(layer, Embedding):
        return nn.Embedding(layer.num_embeddings, layer.dim)
    if isinstance(layer, CrossEntropy):
        return _CrossEntropy(layer)
    if isinstance(layer, MoE):
        return _MoE(layer)
    raise InvalidModel(f"layer {layer.name}: no PyTorch module for {type(layer).__name__}")


@dataclass
class LayerCall:
    """How one layer was called in a forward pass: its role and input tensors' shapes."""

    index: int
    role: str  # "x", "skip" (a shortcut branch), "add", "embed", "embed_add" or "loss"
    shapes: list[tuple[int, ...]]
    dtypes: list[torch.dtype]


def _input_tensor(model: Model, batch: int, device: torch.device) -> torch.Tensor | None:
    """Random input for a model that does not start with an embedding."""
    first = model.layers[0]
    if isinstance(first, Conv2d):
        return torch.randn(batch, first.in_channels, first.height, first.width, device=device)
    if isinstance(first, Linear):
        return torch.randn(batch, first.rows * first.in_features, device=device)
    return None


def embedding_ids(layer: Embedding, batch: int, device: torch.device,
                  first: bool) -> torch.Tensor:
    """Token ids (random) for the first table; positions (0..rows-1) for a later one."""
    if first or layer.num_embeddings < layer.rows:
        return torch.randint(0, layer.num_embeddings, (batch, layer.rows), device=device)
    return torch.arange(layer.rows, device=device).expand(batch, layer.rows)


def loss_target(layer: CrossEntropy, batch: int, device: torch.device) -> torch.Tensor:
    return torch.randint(0, layer.classes, (batch * layer.rows,), device=device)


class Network(nn.Module):
    """A gpusim model as one PyTorch module; ``forward()`` returns the loss of a batch."""

    def __init__(self, model: Model, batch: int, device: torch.device,
                 inplace: bool = True) -> None:
        super().__init__()
        self.model = model
        self.mods = nn.ModuleList([layer_module(layer, inplace) for layer in model.layers])
        index = {layer.name: i for i, layer in enumerate(model.layers)}
        for i, layer in enumerate(model.layers):
            if isinstance(layer, Linear) and layer.tied_to in index:
                # A tied head computes with the token table itself (GPT-2, BERT): one tensor
                # that the step trains and the optimizer steps, as the model counts it.
                self.mods[i].weight = self.mods[index[layer.tied_to]].weight
        self.to(device)
        self.input = _input_tensor(model, batch, device)
        self.ids: dict[int, torch.Tensor] = {}
        self.targets: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(model.layers):
            if isinstance(layer, Embedding):
                self.ids[i] = embedding_ids(layer, batch, device, first=not self.ids)
            elif isinstance(layer, CrossEntropy):
                self.targets[i] = loss_target(layer, batch, device)
        if self.input is None and not self.ids:
            raise InvalidModel(f"{model.name}: the runner cannot tell its input from the first "
                               f"layer ({model.layers[0].name})")
        self.calls: list[LayerCall] | None = None  # filled when recording

    def forward(self) -> torch.Tensor:
        x: torch.Tensor | None = self.input
        skip: torch.Tensor | None = None
        block: str | None = None
        on_skip = False
        for i, (layer, mod) in enumerate(zip(self.model.layers, self.mods, strict=True)):
            if layer.block != block:
                block, skip = layer.block, x
            if isinstance(layer, Embedding):
                y = mod(self.ids[i])
                self._record(i, "embed" if x is None else "embed_add", [self.ids[i]] +
                             ([x] if x is not None else []))
                x = y if x is None else x + y
                continue
            assert x is not None
            if isinstance(layer, CrossEntropy):
                self._record(i, "loss", [x])
                return mod(x, self.targets[i])
            if isinstance(layer, Conv2d) and skip is not None and \
                    tuple(x.shape[1:]) != (layer.in_channels, layer.height, layer.width) and \
                    tuple(skip.shape[1:]) == (layer.in_channels, layer.height, layer.width):
                self._record(i, "skip", [skip])
                skip, on_skip = mod(skip), True
                continue
            if on_skip and isinstance(layer, Elementwise) and layer.op == "batch_norm":
                self._record(i, "skip", [skip])  # type: ignore[list-item]
                skip = mod(skip)
                continue
            on_skip = False
            if isinstance(layer, Elementwise) and layer.op == "add":
                assert skip is not None
                self._record(i, "add", [x, skip])
                x = skip = x + skip
                continue
            self._record(i, "x", [x])
            x = mod(x)
        raise InvalidModel(f"{self.model.name} has no loss layer to end its forward pass")

    def _record(self, index: int, role: str, tensors: list[torch.Tensor]) -> None:
        if self.calls is not None:
            self.calls.append(LayerCall(index, role, [tuple(t.shape) for t in tensors],
                                        [t.dtype for t in tensors]))

    def record_calls(self, autocast: Any) -> list[LayerCall]:
        """One forward pass without gradients, noting each layer's role and input shapes."""
        self.calls = []
        with torch.no_grad(), autocast:
            self.forward()
        calls, self.calls = self.calls, None
        return calls


def trainable_parameters(network: Network) -> int:
    """Parameters the network trains, each tensor once (a tied head shares the token table's
    weight; its bias is its own)."""
    return sum(p.numel() for p in network.parameters())
