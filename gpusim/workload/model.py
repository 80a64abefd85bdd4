"""A model: an ordered list of layers, what one sample is, and totals derived from them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Literal

from gpusim.workload.layers import Layer, Linear
from gpusim.workload.numerics import FP32, Numerics

# Blocks on either side of a model's repeated body. Frameworks checkpoint the body only
# (Megatron-LM and Hugging Face wrap each transformer layer, not the embeddings, the head
# or the loss), and pipeline stages deal out body blocks.
LEAD_BLOCKS = frozenset({"", "embed", "stem"})
TAIL_BLOCKS = frozenset({"", "head", "classifier"})


@dataclass(frozen=True)
class InputSpec:
    """One training sample as the input pipeline sees it.

    ``host_bytes`` is what is copied to the device per sample (uint8 images, int64 tokens);
    ``loader_cpu_s`` the CPU time a data-loader worker spends preparing one sample (decode,
    augment, collate). Both are stated assumptions of the zoo entry, printed with every
    estimate.
    """

    host_bytes: float
    loader_cpu_s: float
    description: str = ""


@dataclass(frozen=True)
class Model:
    """A trainable network. ``tokens_per_sample`` is set for language models (the sequence)."""

    name: str
    layers: tuple[Layer, ...]
    input: InputSpec
    family: Literal["mlp", "cnn", "transformer", "custom"] = "custom"
    tokens_per_sample: int | None = None
    description: str = ""
    source: str = ""

    @cached_property
    def parameters(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def active_parameters(self) -> int:
        """Parameters one token computes with (a mixture of experts' top-k only)."""
        return sum(layer.active_params for layer in self.layers)

    @cached_property
    def forward_flops_per_sample(self) -> float:
        """FLOPs of one sample's forward pass (a multiply-add counts 2)."""
        return sum(op.flops for layer in self.layers for op in layer.forward(1, FP32))

    @cached_property
    def training_flops_per_sample(self) -> float:
        """Forward plus full backward (input and weight gradients) for one sample."""
        return self.training_flops()

    def training_flops(self, trains: Callable[[Layer], bool] | None = None) -> float:
        """Forward plus backward FLOPs of one sample. With ``trains`` (whose weights train),
        weight gradients for those layers only, and input gradients only after the first of
        them: a frozen prefix needs none."""
        layers = self.layers
        first = -1 if trains is None else next(
            (i for i, layer in enumerate(layers) if trains(layer)), len(layers))
        total = 0.0
        for i, layer in enumerate(layers):
            ops = layer.forward(1, FP32)
            if i > first:
                ops += layer.backward_input(1, FP32)
            if trains is None or trains(layer):
                ops += layer.backward_weight(1, FP32)
            total += sum(op.flops for op in ops)
        return total

    def untied(self) -> Model:
        """The same network with each tied layer (a head sharing the token table) holding a
        weight of its own, as a run that did not tie them trained it."""
        layers = tuple(replace(layer, shared=False, tied_to="")
                       if isinstance(layer, Linear) and layer.tied_to else layer
                       for layer in self.layers)
        return replace(self, layers=layers)

    def activation_bytes(self, n: int, num: Numerics) -> float:
        """Bytes kept for backward by a batch of ``n`` with no checkpointing."""
        return sum(layer.saved_bytes(n, num) for layer in self.layers)

    def partition(self) -> tuple[list[Layer], list[list[Layer]], list[Layer]]:
        """Leading layers (embeddings, a stem), the repeated body blocks in order, trailing
        layers (final norm, head, loss)."""
        lead, body, tail = self._parts
        return list(lead), [list(block) for block in body], list(tail)

    @cached_property
    def _parts(self) -> tuple[tuple[Layer, ...], tuple[tuple[Layer, ...], ...],
                              tuple[Layer, ...]]:
        layers = self.layers
        start = 0
        while start < len(layers) and layers[start].block in LEAD_BLOCKS:
            start += 1
        end = len(layers)
        while end > start and layers[end - 1].block in TAIL_BLOCKS:
            end -= 1
        blocks: dict[str, list[Layer]] = {}
        for layer in layers[start:end]:
            blocks.setdefault(layer.block, []).append(layer)
        return layers[:start], tuple(tuple(b) for b in blocks.values()), layers[end:]
