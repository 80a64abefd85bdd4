"""Models from YAML files: a transformer by its dimensions, or a sequential layer list.

Transformer::

    name: my-llm
    transformer: {layers: 32, hidden: 4096, heads: 32, kv_heads: 8, vocab: 128256,
                  norm: rmsnorm, activation: swiglu, seq_len: 4096}

Sequential (shapes are tracked, so layers give only their own settings)::

    name: my-cnn
    input: {channels: 3, height: 32, width: 32}      # or {features: 784}
    classes: 10
    layers:
      - {type: conv2d, out: 64, kernel: 3, padding: 1}
      - {type: batchnorm}
      - {type: relu}
      - {type: maxpool, kernel: 2}
      - {type: linear, out: 10}
      - {type: cross_entropy}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpusim.errors import InvalidModel, InvalidProfile
from gpusim.hardware.catalog import format_validation_error, read_yaml
from gpusim.workload import hf_config, zoo
from gpusim.workload.attention import CrossEntropy
from gpusim.workload.layers import Linear, dropout, gelu, relu
from gpusim.workload.model import InputSpec, Model
from gpusim.workload.zoo.transformer import TransformerConfig, build_transformer
from gpusim.workload.zoo.vision import ShapeBuilder

_INPUT = InputSpec(0.0, 5e-6, "tensors held in memory (YAML model; no loader cost stated)")


def load_model_file(path: str | Path, seq_len: int | None = None) -> Model:
    """Build the model a YAML file or a Hugging Face config.json describes; InvalidModel
    names what is wrong."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        data = hf_config.read_config_file(path)
        name = path.parent.name if path.stem == "config" and path.parent.name else path.stem
        return model_from_dict({"name": name, **data}, str(path), seq_len)
    try:
        data = read_yaml(path)
    except InvalidProfile as exc:
        raise InvalidModel(str(exc)) from exc
    return model_from_dict(data, str(path), seq_len)


def model_from_dict(data: dict[str, Any], source: str, seq_len: int | None = None) -> Model:
    name = str(data.get("name", Path(source).stem))
    if hf_config.is_hf_config(data):
        return hf_config.model_from_hf(data, source, name, seq_len,
                                       decoder_seq_len=data.get("decoder_seq_len"))
    if "hf_config" in data:
        if not isinstance(data["hf_config"], dict):
            raise InvalidModel(f"{source}: hf_config must be the mapping of a config.json")
        repo = data.get("hf_repo", "")
        # decoder_seq_len beside hf_config: an encoder-decoder's target tokens
        return hf_config.model_from_hf(data["hf_config"], source, name, seq_len,
                                       repo if isinstance(repo, str) else "",
                                       decoder_seq_len=data.get("decoder_seq_len"))
    if "transformer" in data:
        if not isinstance(data["transformer"], dict):
            raise InvalidModel(f"{source}: transformer must be a mapping of dimensions "
                               f"(layers, hidden, heads, ...)")
        try:
            cfg = TransformerConfig.model_validate({"name": name, **data["transformer"]})
        except ValidationError as exc:
            raise InvalidModel(format_validation_error(source, exc)) from exc
        return build_transformer(cfg, seq_len)
    if "layers" in data and "input" in data:
        return _sequential(name, data, source)
    raise InvalidModel(f"{source}: expected a 'transformer' mapping, 'input' and 'layers', or "
                       f"a Hugging Face config (with its model_type)")


def _whole(value: Any, what: str, least: int = 1) -> int:
    """A whole number of at least ``least``: not a bool, a fraction, an infinity or text."""
    whole = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and value.is_integer())
    if not whole:
        raise ValueError(f"{what} must be a whole number (got {value!r})")
    if int(value) < least:
        raise ValueError(f"{what} must be at least {least} (got {value!r})")
    return int(value)


def _sequential(name: str, data: dict[str, Any], source: str) -> Model:
    shape = data["input"]
    if not isinstance(shape, dict):
        raise InvalidModel(f"{source}: input must be a mapping")
    try:
        if "features" in shape:
            b = ShapeBuilder(_whole(shape["features"], "input features"), 1, 1)
        else:
            b = ShapeBuilder(_whole(shape["channels"], "input channels"),
                             _whole(shape["height"], "input height"),
                             _whole(shape["width"], "input width"))
    except KeyError as exc:
        raise InvalidModel(f"{source}: input needs features, or channels, height and "
                           f"width") from exc
    except ValueError as exc:
        raise InvalidModel(f"{source}: {exc}") from exc
    layers = data["layers"]
    if not isinstance(layers, list) or not layers:
        raise InvalidModel(f"{source}: layers must be a list of at least one layer")
    for i, spec in enumerate(layers):
        if not isinstance(spec, dict) or "type" not in spec:
            raise InvalidModel(f"{source}: layers[{i}] needs a type")
        try:
            _add(b, f"{spec['type']}{i}", spec)
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidModel(f"{source}: layers[{i}] ({spec['type']}): {exc}") from exc
        if min(b.c, b.h, b.w) < 1:
            raise InvalidModel(f"{source}: layers[{i}] ({spec['type']}) leaves an empty output "
                               f"({b.c} x {b.h} x {b.w}): its kernel is larger than its input")
    spec_in = InputSpec(4.0 * _input_elements(shape), _INPUT.loader_cpu_s, _INPUT.description)
    return Model(name, tuple(b.layers), spec_in, "custom",
                 description=str(data.get("description", "")))


def _input_elements(shape: dict[str, Any]) -> int:
    if "features" in shape:
        return int(shape["features"])
    return int(shape["channels"]) * int(shape["height"]) * int(shape["width"])


def _add(b: ShapeBuilder, name: str, spec: dict[str, Any]) -> None:
    kind = spec["type"]
    if kind == "conv2d":
        b.conv(name, _whole(spec["out"], "out"), _whole(spec["kernel"], "kernel"),
               _whole(spec.get("stride", 1), "stride"),
               _whole(spec.get("padding", 0), "padding", 0), bool(spec.get("bias", False)))
    elif kind == "batchnorm":
        b.bn(name)
    elif kind in ("relu", "gelu", "dropout"):
        make = {"relu": relu, "gelu": gelu, "dropout": dropout}[kind]
        b.layers.append(make(name, b.elements))
    elif kind in ("maxpool", "avgpool"):
        k = _whole(spec.get("kernel", 2), "kernel")
        b.pool(name, k, _whole(spec.get("stride", k), "stride"),
               _whole(spec.get("padding", 0), "padding", 0), op=kind)
    elif kind == "global_avgpool":
        b.global_pool(name)
    elif kind == "flatten":
        b.c, b.h, b.w = b.elements, 1, 1
    elif kind == "linear":
        width = b.elements
        out = _whole(spec["out"], "out")
        b.layers.append(Linear(name, width, out, bias=bool(spec.get("bias", True))))
        b.c, b.h, b.w = out, 1, 1
    elif kind == "cross_entropy":
        b.layers.append(CrossEntropy(name, b.elements))
    else:
        raise ValueError("unknown type; use conv2d, batchnorm, relu, gelu, dropout, maxpool, "
                         "avgpool, global_avgpool, flatten, linear or cross_entropy")


def model_from_spec(spec: dict[str, Any]) -> Model:
    """A model from a compact spec, as measurement files record it: ``{"zoo": name,
    "seq_len": S, "image_size": P}`` for a zoo model, or a transformer mapping as in YAML."""
    if "zoo" in spec:
        return zoo.get(str(spec["zoo"]), spec.get("seq_len"), spec.get("image_size"))
    return model_from_dict(spec, str(spec.get("name", "model spec")), spec.get("seq_len"))
