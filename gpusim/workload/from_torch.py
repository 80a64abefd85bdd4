"""A gpusim model from any PyTorch module: run it once on the meta device (no memory, no
GPU, no arithmetic) and record the torch functions it calls, each as the gpusim layer that
costs it.

    model = gpusim.from_torch(MyNet(), torch.zeros(8, 3, 224, 224))

The functions are caught where the module calls them (a TorchFunctionMode, the level at
which ``F.linear`` or ``F.scaled_dot_product_attention`` is one call rather than the kernels
it becomes), so a layer is what the code wrote. Views and shape queries cost nothing. A
function gpusim has no layer for is listed in the model's description and in
``unsupported``, never dropped silently. torch is imported here only.
"""

from __future__ import annotations

import copy
import importlib
import math
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpusim.errors import InvalidModel, MissingDependency
from gpusim.workload.attention import Attention, CrossEntropy, Embedding
from gpusim.workload.layers import (
    Conv2d,
    Elementwise,
    Layer,
    Linear,
    batch_norm,
    dropout,
    gelu,
    layer_norm,
    pool,
    relu,
    residual_add,
    rms_norm,
    softmax,
)
from gpusim.workload.model import InputSpec, Model

# What a sample costs the loader when its source does not say (tensors held in memory).
LOADER_CPU_S = 5e-6

# Functions that only look at or re-view a tensor: no kernel, nothing kept.
FREE = frozenset({
    "view", "reshape", "flatten", "unflatten", "permute", "transpose", "t", "squeeze",
    "unsqueeze", "expand", "expand_as", "size", "dim", "numel", "__getitem__", "chunk",
    "split", "unbind", "narrow", "select", "contiguous", "detach", "to", "type_as", "float",
    "half", "bfloat16", "__get__", "__len__", "__iter__", "__format__", "__repr__",
    "is_floating_point", "stride", "storage_offset", "__eq__", "__bool__", "item", "tolist",
    "new_empty", "new_zeros", "new_ones", "zeros", "ones", "arange", "empty", "full",
    "zeros_like", "ones_like", "empty_like", "triu", "tril", "view_as", "movedim", "__setitem__",
    "requires_grad_", "retain_grad", "_has_compatible_shallow_copy_type", "data_ptr",
    "get_device", "element_size", "__hash__", "__index__", "__int__", "__float__",
})
ACTIVATIONS = {"relu": (1.0, "relu"), "silu": (4.0, "silu"),
               "sigmoid": (4.0, "sigmoid"), "tanh": (4.0, "tanh"), "gelu": (8.0, "gelu"),
               "leaky_relu": (1.0, "relu"), "elu": (4.0, "elu"), "mish": (8.0, "mish"),
               "hardswish": (3.0, "hardswish"), "softplus": (4.0, "softplus"),
               "exp": (1.0, "exp"), "sqrt": (1.0, "sqrt"), "rsqrt": (1.0, "rsqrt"),
               "neg": (1.0, "neg"), "abs": (1.0, "abs"), "pow": (1.0, "pow"),
               "cos": (4.0, "cos"), "sin": (4.0, "sin")}
BINARY = frozenset({"add", "__add__", "__radd__", "__iadd__", "add_", "mul", "__mul__",
                    "__rmul__", "__imul__", "mul_", "sub", "__sub__", "__rsub__", "div",
                    "__truediv__", "__rtruediv__", "div_", "where", "masked_fill",
                    "masked_fill_"})
COPIES = frozenset({"cat", "stack", "clone", "repeat", "repeat_interleave", "pad",
                    "interpolate", "roll"})
REDUCTIONS = frozenset({"mean", "sum", "amax", "max", "min", "norm", "var", "std"})


@dataclass
class _Recorder:
    """Turns the torch calls of one forward into gpusim layers, per sample of ``batch``."""

    batch: int
    torch: Any
    layers: list[Layer] = field(default_factory=list)
    unsupported: Counter[str] = field(default_factory=Counter)
    owners: dict[int, str] = field(default_factory=dict)  # parameter id -> first layer
    path: list[str] = field(default_factory=list)  # qualified names of the modules running
    counts: Counter[str] = field(default_factory=Counter)
    output_classes: int = 0

    def name(self, what: str) -> str:
        scope = self.path[-1] if self.path and self.path[-1] else "model"
        self.counts[f"{scope}.{what}"] += 1
        n = self.counts[f"{scope}.{what}"]
        return f"{scope}.{what}" + (f"{n}" if n > 1 else "")

    def block(self) -> str:
        """The repeated unit a layer belongs to: the module path up to its first index
        (``layers.3``), as a transformer's blocks or a ResNet's stages are held."""
        parts: list[str] = []
        for part in (self.path[-1] if self.path else "").split("."):
            parts.append(part)
            if part.isdigit():
                return ".".join(parts)
        return ""

    def per_sample(self, tensor: Any) -> int:
        return max(1, int(tensor.numel()) // self.batch)

    def owner(self, param: Any, layer: str) -> str:
        """'' for a parameter's first use; else the layer that owns it (weights tied)."""
        if param is None:
            return ""
        first = self.owners.setdefault(id(param), layer)
        return "" if first == layer else first

    def record(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               out: Any) -> None:
        fname = getattr(func, "__name__", str(func))
        tensors = [a for a in args if isinstance(a, self.torch.Tensor)]
        if fname in FREE or not tensors:
            return
        if max(t.numel() for t in tensors) < self.batch and fname not in ("linear", "conv2d"):
            return  # bookkeeping on a few numbers (batch norm's step counter), not data
        handler = getattr(self, f"_{fname.strip('_')}", None)
        if handler is not None:
            handler(args, kwargs, out)
        elif fname.rstrip("_") in ACTIVATIONS:  # relu_ and the like: in place
            flops, op = ACTIVATIONS[fname.rstrip("_")]
            elements = self.per_sample(tensors[0])
            if op == "relu":
                self.add(relu(self.name("relu"), elements, block=self.block(),
                              inplace=fname.endswith("_") or bool(kwargs.get("inplace"))))
            elif op == "gelu":
                self.add(gelu(self.name("gelu"), elements, block=self.block()))
            else:
                self.add(Elementwise(self.name(op), elements, flops_per_element=flops,
                                     block=self.block(), op=op))
        elif fname in BINARY:
            self._add_binary(fname, tensors, out)
        elif fname in COPIES:
            out_t = out[0] if isinstance(out, (tuple, list)) else out
            self.add(Elementwise(self.name(fname), self.per_sample(out_t), saves=0,
                                 flops_per_element=0, block=self.block(), op="copy"))
        elif fname in REDUCTIONS:
            self.add(Elementwise(self.name(fname), self.per_sample(tensors[0]),
                                 writes=1 / max(1, self.per_sample(tensors[0])),
                                 saves=0, block=self.block(), op=fname))
        else:
            self.unsupported[fname] += 1

    def add(self, layer: Layer) -> None:
        self.layers.append(layer)

    # --- functions with a gpusim layer of their own --------------------------------------

    def _linear(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        x, weight = args[0], args[1]
        bias = args[2] if len(args) > 2 else kwargs.get("bias")
        out_f, in_f = int(weight.shape[0]), int(weight.shape[1])
        name = self.name("linear")
        tied = self.owner(weight, name)
        self.owner(bias, name)
        self.add(Linear(name, in_f, out_f, rows=max(1, self.per_sample(x) // in_f),
                        bias=bias is not None, shared=bool(tied), tied_to=tied,
                        block=self.block()))

    def _conv2d(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        x, weight = args[0], args[1]
        bias = args[2] if len(args) > 2 else kwargs.get("bias")

        def arg(i: int, key: str, default: Any) -> Any:
            value = args[i] if len(args) > i else kwargs.get(key, default)
            return value[0] if isinstance(value, (tuple, list)) else value

        stride, padding, groups = arg(3, "stride", 1), arg(4, "padding", 0), arg(6, "groups", 1)
        if isinstance(padding, str):  # "same" keeps the size; "valid" pads nothing
            padding = (int(weight.shape[2]) - 1) // 2 if padding == "same" else 0
        name = self.name("conv")
        self.owner(weight, name)
        self.owner(bias, name)
        self.add(Conv2d(name, int(x.shape[1]), int(weight.shape[0]), int(weight.shape[2]),
                        int(x.shape[2]), int(x.shape[3]), int(stride), int(padding),
                        int(groups), bias is not None, block=self.block()))

    def _embedding(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        ids, weight = args[0], args[1]
        name = self.name("embedding")
        if self.owner(weight, name):  # a table read twice: counted once
            self.unsupported["embedding of a table used before"] += 1
            return
        self.add(Embedding(name, int(weight.shape[0]), int(weight.shape[1]),
                           rows=self.per_sample(ids), block=self.block()))

    def _add_norm(self, kind: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                  weight: Any, bias: Any) -> None:
        x = args[0]
        shape: Any = args[1] if len(args) > 1 else kwargs.get("normalized_shape", 1)
        width = math.prod(shape) if isinstance(shape, (tuple, list)) else int(shape)
        name = self.name(kind)
        for param in (weight, bias):
            self.owner(param, name)
        make = layer_norm if kind == "layer_norm" else rms_norm
        layer = make(name, width, max(1, self.per_sample(x) // width), block=self.block())
        params = sum(int(p.numel()) for p in (weight, bias) if p is not None)
        self.add(_with_params(layer, params))

    def _layer_norm(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        self._add_norm("layer_norm", args, kwargs, _arg(args, kwargs, 2, "weight"),
                       _arg(args, kwargs, 3, "bias"))

    def _rms_norm(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        self._add_norm("rms_norm", args, kwargs, _arg(args, kwargs, 2, "weight"), None)

    def _channel_norm(self, kind: str, x: Any, weight: Any, bias: Any) -> None:
        """Batch or group norm: statistics over each channel's (or group's) elements."""
        name = self.name(kind)
        for param in (weight, bias):
            self.owner(param, name)
        layer = batch_norm(name, int(x.shape[1]), self.per_sample(x), block=self.block())
        params = sum(int(p.numel()) for p in (weight, bias) if p is not None)
        self.add(_with_params(layer, params))

    def _batch_norm(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        self._channel_norm("batch_norm", args[0], _arg(args, kwargs, 3, "weight"),
                           _arg(args, kwargs, 4, "bias"))

    def _group_norm(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        self._channel_norm("group_norm", args[0], _arg(args, kwargs, 2, "weight"),
                           _arg(args, kwargs, 3, "bias"))

    def _scaled_dot_product_attention(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                                      out: Any) -> None:
        q, k = args[0], args[1]
        mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
        p = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
        causal = bool(args[5] if len(args) > 5 else kwargs.get("is_causal", False))
        heads, seq, head_dim = int(q.shape[-3]), int(q.shape[-2]), int(q.shape[-1])
        if mask is not None:
            self.unsupported["scaled_dot_product_attention with a mask (costed as dense)"] += 1
        self.add(Attention(self.name("attention"), heads, head_dim, seq,
                           kv_heads=int(k.shape[-3]), causal=causal, dropout=bool(p),
                           kv_seq=int(k.shape[-2]) if int(k.shape[-2]) != seq else 0,
                           block=self.block()))

    def _dropout(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
        training = args[2] if len(args) > 2 else kwargs.get("training", True)
        if p and training:
            self.add(dropout(self.name("dropout"), self.per_sample(args[0]),
                             block=self.block()))

    def _softmax(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        self.add(softmax(self.name("softmax"), self.per_sample(args[0]), block=self.block()))

    _log_softmax = _softmax

    def _add_pool(self, op: str, args: tuple[Any, ...], out: Any) -> None:
        self.add(pool(self.name(op), self.per_sample(args[0]), self.per_sample(out),
                      block=self.block(), op=op))

    def _max_pool2d(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        self._add_pool("maxpool", args, out[0] if isinstance(out, tuple) else out)

    def _avg_pool2d(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        self._add_pool("avgpool", args, out)

    def _adaptive_avg_pool2d(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                             out: Any) -> None:
        self._add_pool("avgpool", args, out)

    def _cross_entropy(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        logits = args[0]
        classes = int(logits.shape[-1] if logits.dim() != 4 else logits.shape[1])
        self.add(CrossEntropy(self.name("cross_entropy"), classes,
                              rows=max(1, self.per_sample(logits) // classes),
                              block=self.block()))

    def _add_binary(self, fname: str, tensors: list[Any], out: Any) -> None:
        out_t = out if isinstance(out, self.torch.Tensor) else tensors[0]
        elements = self.per_sample(out_t)
        both = len(tensors) > 1 and all(t.numel() > 1 for t in tensors)
        if fname in ("add", "__add__", "__radd__", "__iadd__", "add_") and both:
            self.add(residual_add(self.name("add"), elements, block=self.block()))
        else:
            self.add(Elementwise(self.name(fname.strip("_")), elements, reads=2 if both else 1,
                                 bwd_reads=2, saves=1 if both else 0, block=self.block(),
                                 op="mul" if "mul" in fname else fname.strip("_")))


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, key: str,
         default: Any = None) -> Any:
    """A torch function's argument, given by position or by name."""
    return args[index] if len(args) > index else kwargs.get(key, default)


def _with_params(layer: Elementwise, params: int) -> Elementwise:
    """A norm with the parameters the module really has (affine or not)."""
    return replace(layer, param_count=params)


def from_torch(module: Any, example_inputs: Any, *, name: str | None = None,
               loss: bool = True, batch_dim: int = 0) -> Model:
    """The gpusim model of ``module`` run on ``example_inputs`` (a tensor or a tuple of them;
    the first dimension is the batch). With ``loss``, cross-entropy over the output's last
    dimension is added when the module computes none itself (training needs one)."""
    try:
        import torch
        from torch.overrides import TorchFunctionMode
    except ImportError as exc:
        raise MissingDependency("from_torch needs PyTorch: pip install torch") from exc
    inputs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise InvalidModel("example_inputs must be a tensor or a tuple of tensors")
    batch = int(inputs[0].shape[batch_dim]) if inputs[0].dim() else 1
    meta = _on_meta(module, torch)
    rec = _Recorder(batch, torch)
    hooks = _name_scopes(meta, rec)

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            rec.record(func, args, kwargs, out)
            return out

    try:
        with Mode():
            out = meta(*(t.to("meta") for t in inputs))
    except Exception as exc:  # the user's module: any failure is theirs to see, in a line
        raise InvalidModel(f"{type(module).__name__} did not run on the meta device: "
                           f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from exc
    finally:
        for hook in hooks:
            hook.remove()
    if not rec.layers:
        raise InvalidModel(f"{type(module).__name__} called no torch function gpusim costs")
    logits = out[0] if isinstance(out, (tuple, list)) else getattr(out, "logits", out)
    if loss and not any(isinstance(la, CrossEntropy) for la in rec.layers) \
            and isinstance(logits, torch.Tensor) and logits.dim() >= 2:
        classes = int(logits.shape[-1])
        rec.path = []
        rec.add(CrossEntropy(rec.name("loss"), classes,
                             rows=max(1, logits.numel() // (batch * classes))))
    counted = sum(la.params for la in rec.layers)
    total = sum(int(p.numel()) for p in meta.parameters())
    if counted != total:
        rec.unsupported[f"{total - counted:,} parameters of functions not costed"] += 1
    first = inputs[0]
    tokens = int(first.shape[1]) if first.dim() == 2 and not first.is_floating_point() else None
    host = sum(t.numel() * t.element_size() for t in inputs) / batch
    missing = ", ".join(f"{k} ({n})" for k, n in rec.unsupported.most_common())
    description = (f"{type(module).__name__} from PyTorch ({len(rec.layers)} layers)"
                   + (f"; not costed: {missing}" if missing else ""))
    return Model(name or type(module).__name__, tuple(rec.layers),
                 InputSpec(float(host), LOADER_CPU_S, "example inputs held in memory"),
                 "custom", tokens_per_sample=tokens, description=description,
                 source="gpusim.from_torch")


def _on_meta(module: Any, torch: Any) -> Any:
    """The module with every parameter and buffer on the meta device (a copy, unless it is
    there already), in training mode."""
    on_meta = all(t.is_meta for t in [*module.parameters(), *module.buffers()])
    if on_meta:
        return module.train()
    meta = copy.deepcopy(module)  # the copy keeps tied weights tied; moving them does not
    tied: dict[int, list[tuple[str, str]]] = {}
    for path, sub in meta.named_modules(remove_duplicate=False):
        for pname, param in sub.named_parameters(recurse=False):
            tied.setdefault(id(param), []).append((path, pname))
    meta = meta.to("meta")
    for (first, first_name), *others in (v for v in tied.values() if len(v) > 1):
        param = getattr(meta.get_submodule(first), first_name)
        for path, pname in others:
            setattr(meta.get_submodule(path), pname, param)
    return meta.train()


def _name_scopes(module: Any, rec: _Recorder) -> list[Any]:
    """Hooks that keep ``rec.path`` at the module running now, so a layer is named and
    grouped by where the code calls it."""
    hooks = []
    for qualified, sub in module.named_modules():
        def enter(_mod: Any, _args: Any, part: str = qualified) -> None:
            rec.path.append(part)

        def leave(_mod: Any, _args: Any, _out: Any) -> None:
            rec.path.pop()

        hooks.append(sub.register_forward_pre_hook(enter))
        hooks.append(sub.register_forward_hook(leave))
    return hooks


def load_torch_model(spec: str, input_shape: Sequence[int] | None, *,
                     integer_input: bool = False) -> Model:
    """``package.module:function`` (a function returning a module, or a module class) built
    on the meta device, run on zeros of ``input_shape`` (its first number the batch)."""
    try:
        import torch
    except ImportError as exc:
        raise MissingDependency("a PyTorch model needs PyTorch: pip install torch") from exc
    where, _, attr = spec.partition(":")
    if not where or not attr:
        raise InvalidModel(f"a PyTorch model is package.module:function (got {spec!r})")
    if not input_shape:
        raise InvalidModel(f"{spec}: give the input's shape, batch first "
                           f"(--input-shape 8,3,224,224)")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # the user's own package, where they run it
    try:
        build = getattr(importlib.import_module(where), attr)
    except Exception as exc:  # ImportError, AttributeError, or a module's own failure
        raise InvalidModel(f"cannot import {spec}: {exc}") from exc
    try:
        with torch.device("meta"):
            module = build()
    except Exception as exc:  # the user's code
        raise InvalidModel(f"{spec}() failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(module, torch.nn.Module):
        raise InvalidModel(f"{spec}() returned a {type(module).__name__}, not a torch module")
    dtype = torch.long if integer_input else torch.float32
    example = torch.zeros(*input_shape, dtype=dtype, device="meta")
    return from_torch(module, example, name=spec)
