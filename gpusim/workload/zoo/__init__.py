"""The model zoo: named models people train, with published parameter counts.

``get(name)`` builds a model; ``names()`` lists them. Transformers take an optional
``seq_len`` that overrides their default context; image models (the ImageNet CNNs, vision
transformers and the DiT diffusion transformers) an optional ``image_size``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from gpusim.data import data_dir
from gpusim.errors import UnknownModel
from gpusim.workload.model import Model
from gpusim.workload.zoo.dit import DITS, DiTConfig, build_dit
from gpusim.workload.zoo.transformer import TRANSFORMERS, TransformerConfig, build_transformer
from gpusim.workload.zoo.transformer_xl import TRANSFORMER_XLS, build_transformer_xl
from gpusim.workload.zoo.vision import alexnet, mnist_cnn, mnist_mlp, resnet50, vgg16

_VISION: dict[str, Callable[..., Model]] = {
    "mnist-mlp": mnist_mlp,
    "mnist-cnn": mnist_cnn,
    "alexnet": alexnet,
    "vgg16": vgg16,
    "resnet50": resnet50,
}
# (llama-3-8b, llama-3-70b and llama-2-7b are the shipped configs' names, the same models
# as llama3-8b, llama3-70b and llama2-7b built from their dimensions.)
_ALIASES = {"resnet-50": "resnet50", "rn50": "resnet50", "vgg-16": "vgg16",
            "gpt2-small": "gpt2", "gpt-2": "gpt2", "gpt-3": "gpt3-175b", "gpt3": "gpt3-175b",
            "txl-base": "transformer-xl-base", "txl-large": "transformer-xl-large",
            **{f"dit-{c.size.lower()}/{c.patch}": name for name, c in DITS.items()}}


@lru_cache(maxsize=1)
def shipped_configs() -> dict[str, Path]:
    """The open models whose Hugging Face configs ship with gpusim (models/<name>.yaml)."""
    folder = data_dir("models")
    if not folder.is_dir():
        return {}
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))
            if p.stem not in _VISION and p.stem not in TRANSFORMERS and p.stem not in DITS
            and p.stem not in TRANSFORMER_XLS}


def names() -> list[str]:
    """Every zoo model name: vision, transformers, Transformer-XL, diffusion transformers,
    then the shipped configs."""
    return [*_VISION, *TRANSFORMERS, *TRANSFORMER_XLS, *DITS, *shipped_configs()]


def _resolve(name: str) -> str:
    key = name.lower().strip()
    key = _ALIASES.get(key, key)
    if (key in _VISION or key in TRANSFORMERS or key in TRANSFORMER_XLS or key in DITS
            or key in shipped_configs()):
        return key
    close = difflib.get_close_matches(key, names() + list(_ALIASES), n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(_ALIASES.get(c, c) for c in close)}?" if close else ""
    raise UnknownModel(f"unknown model {name!r}{hint} (`gpusim models list` shows all)")


def transformer_config(name: str) -> TransformerConfig | None:
    """The dimensions of a zoo transformer, or None for other models."""
    return TRANSFORMERS.get(_resolve(name))


# ImageNet CNNs whose input resolution may be changed (MNIST models are fixed at 28x28).
_RESIZABLE = ("alexnet", "vgg16", "resnet50")


def _vision_transformers() -> list[str]:
    return [name for name, cfg in TRANSFORMERS.items() if cfg.kind == "vision"]


def _resizable() -> str:
    return ", ".join((*_RESIZABLE, *_vision_transformers(), *DITS))


def get(name: str, seq_len: int | None = None, image_size: int | None = None) -> Model:
    """Build zoo model ``name``; ``seq_len`` applies to transformers, ``image_size`` (square
    input, default 224; 256 for the DiT models, whose latent is an eighth of it) to the
    image models."""
    key = _resolve(name)
    if key in _VISION:
        if image_size is None:
            return _VISION[key]()
        if key not in _RESIZABLE:
            raise UnknownModel(f"{key} has a fixed input size; image_size applies to "
                               f"{_resizable()}")
        return _VISION[key](image_size)
    if key in TRANSFORMER_XLS:  # seq_len: the segment (tgt_len); the memory stays
        if image_size is not None:
            raise UnknownModel(f"{key} takes no image size; image_size applies to "
                               f"{_resizable()}")
        return build_transformer_xl(TRANSFORMER_XLS[key], seq_len)
    if key in DITS:  # a sequence length does not apply: the tokens follow the image
        return build_dit(DITS[key], image_size)
    if key in TRANSFORMERS:
        cfg = TRANSFORMERS[key]
        if image_size is not None:
            if cfg.kind != "vision":
                raise UnknownModel(f"{key} takes no image size; image_size applies to "
                                   f"{_resizable()}")
            cfg = cfg.model_copy(update={"image_size": image_size})
        return build_transformer(cfg, seq_len)
    from gpusim.workload.formats import load_model_file  # formats reads the zoo too

    return load_model_file(shipped_configs()[key], seq_len)


__all__ = ["DiTConfig", "TransformerConfig", "build_dit", "build_transformer", "get", "names",
           "transformer_config"]
