"""What a sweep can vary, and how its values are written.

A name is a keyword of ``gpusim.estimation.estimate``, found by inspecting its signature so that
keywords it gains later can be swept with no change here, or ``gpu.FIELD``: a numeric field of
the device profile (``gpu.memory_bandwidth_gb_s``), or one entry of a per-precision table
(``gpu.matrix_tflops.bf16``).

Values are ``START:STOP:COUNT`` (evenly spaced, both ends included), ``START:STOP:COUNT:log``
(geometric), or a comma list ``x,y,z`` whose items read as int, float or string.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable
from functools import lru_cache
from typing import Annotated, Any, get_args, get_origin, get_type_hints

from pydantic import ConfigDict, TypeAdapter, ValidationError

from gpusim.errors import InvalidConfig, InvalidProfile
from gpusim.hardware.catalog import format_validation_error
from gpusim.hardware.profile import PRECISIONS, CPUProfile, DeviceProfile, GPUProfile

Value = int | float | str
GPU_PREFIX = "gpu."
# Profile fields that describe a device but that no estimate reads: a sweep over one changes
# nothing, and its note says why.
DESCRIPTIVE = {
    "cuda_cores": "a count the datasheet gives; the model works from the peak FLOP/s",
    "tensor_cores": "a count the datasheet gives; the model works from the peak FLOP/s",
    "l2_cache_mib": "the cost model does not model caches",
    "launch_price_usd": "a purchase price: compare and budget read it, estimate does not",
    "memory_channels": "the model works from the memory bandwidth",
    "l3_cache_mib": "the cost model does not model caches",
    "threads": "the model works from the cores and their FMA units",
    **{f"vector_tflops.{p}": "elementwise work runs at the fp32 vector rate; matrix work on "
                             "the matrix units" for p in ("tf32", "fp16", "bf16", "fp8")},
    **{f"{table}.{p}": f"no training precision runs in {p}"
       for table in ("vector_tflops", "matrix_tflops") for p in ("fp64", "int8")},
}
# More values than this in one range is a typing slip, refused before any list is built.
LONGEST_RANGE = 100_000
# What a varied profile field cites as its source: the profile schema requires one.
WHAT_IF_SOURCE = "what-if value set by gpusim sweep"


def parse_scalar(text: str) -> Value:
    """``"8"`` -> 8, ``"1e9"`` -> 1e9, anything else stays a string."""
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_values(spec: str) -> list[Value]:
    """The values of one ``--vary`` spec (a range or a comma list), checked for repeats."""
    parts = spec.split(":")
    # A colon after a number means a range; anything else (a path, say) is a list item.
    if "," not in spec and len(parts) > 1 and not isinstance(parse_scalar(parts[0]), str):
        values = _range(spec, parts)
    else:
        values = [parse_scalar(item) for item in spec.split(",")]
    if any(v == "" for v in values):
        raise InvalidConfig(f"empty value in {spec!r}; write values as x,y,z")
    seen = [str(v) for v in values]
    repeats = sorted({s for s in seen if seen.count(s) > 1})
    if repeats:
        raise InvalidConfig(f"{spec!r} gives {', '.join(repeats)} more than once")
    return values


def _range(spec: str, parts: list[str]) -> list[Value]:
    usage = (f"range {spec!r} must be START:STOP:COUNT or START:STOP:COUNT:log "
             "(e.g. 1000:4000:7)")
    if len(parts) not in (3, 4) or (len(parts) == 4 and parts[3].strip() != "log"):
        raise InvalidConfig(usage)
    start, stop, count = (parse_scalar(p) for p in parts[:3])
    if isinstance(start, str) or isinstance(stop, str) or not isinstance(count, int):
        raise InvalidConfig(usage)
    if count < 1:
        raise InvalidConfig(f"range {spec!r}: COUNT must be 1 or more")
    if count > LONGEST_RANGE:
        raise InvalidConfig(f"range {spec!r}: {count:,} values is more than any sweep can "
                            f"run; one range takes at most {LONGEST_RANGE:,}")
    if count == 1:
        return [start]
    log = len(parts) == 4
    if log and (start <= 0 or stop <= 0):
        raise InvalidConfig(f"range {spec!r}: a log range needs START and STOP above 0")
    both_int = isinstance(start, int) and isinstance(stop, int)
    if both_int and not log and (stop - start) % (count - 1) == 0:
        step = (stop - start) // (count - 1)
        return [int(start) + step * i for i in range(count)]
    points = [start * (stop / start) ** (i / (count - 1)) if log
              else start + (stop - start) * i / (count - 1) for i in range(count)]
    # 12 significant digits: 0.3, not 0.30000000000000004, in files and plots.
    floats = [float(start), *(float(f"{x:.12g}") for x in points[1:-1]), float(stop)]
    if both_int and all(x.is_integer() for x in floats):
        return [int(x) for x in floats]
    return list(floats)


def parse_assignment(text: str, flag: str) -> tuple[str, str]:
    """``"name=spec"`` -> (name, spec)."""
    name, sep, spec = text.partition("=")
    if not sep or not name.strip() or not spec.strip():
        raise InvalidConfig(f"{flag} takes NAME=VALUES (e.g. {flag} batch_size=64,128); "
                            f"got {text!r}")
    name = name.strip()
    if not name.startswith(GPU_PREFIX):
        name = name.replace("-", "_")  # batch-size as the flag spells it
    return name, spec.strip()


def keywords(target: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    """The keywords of ``target`` (``estimate``) that a sweep may set."""
    return dict(inspect.signature(target).parameters)


def required(target: Callable[..., Any]) -> list[str]:
    return [k for k, p in keywords(target).items() if p.default is inspect.Parameter.empty]


@lru_cache(maxsize=1)
def gpu_fields() -> dict[str, Any]:
    """``field`` or ``table.precision`` -> its type with constraints, over GPU and CPU
    profiles (a field only one kind has is checked per point)."""
    fields: dict[str, Any] = {}
    for kind in (GPUProfile, CPUProfile):
        for name, info in kind.model_fields.items():
            tp = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
            if get_origin(info.annotation) is dict:
                value_type = get_args(info.annotation)[1]
                if _numeric(value_type):
                    fields.update({f"{name}.{p}": value_type for p in PRECISIONS})
            elif _numeric(info.annotation):
                fields[name] = tp
    return fields


def _numeric(tp: Any) -> bool:
    if tp is bool:
        return False
    return tp in (int, float) or any(_numeric(arg) for arg in get_args(tp))


def check_name(name: str, target: Callable[..., Any]) -> None:
    """Raise InvalidConfig for a name that is neither a keyword nor a profile field."""
    if name.startswith(GPU_PREFIX):
        field = name[len(GPU_PREFIX):]
        known = gpu_fields()
        if field in known:
            return
        if any(k.startswith(field + ".") for k in known):
            raise InvalidConfig(f"{name} is a per-precision table: name one entry, e.g. "
                                f"{name}.bf16")
        choices = sorted({k.split(".")[0] if "." in k else k for k in known})
        hint = _did_you_mean(field, list(known), GPU_PREFIX)
        raise InvalidConfig(f"unknown profile field {name!r}{hint}; numeric fields: "
                            f"{', '.join(choices)} (tables as gpu.matrix_tflops.bf16)")
    names = list(keywords(target))
    if name not in names:
        hint = _did_you_mean(name, [*names, *(GPU_PREFIX + k for k in gpu_fields())], "")
        raise InvalidConfig(f"unknown field {name!r}{hint}; sweepable: {', '.join(names)}, "
                            "or gpu.FIELD for a profile field (e.g. gpu.memory_bandwidth_gb_s)")


def _did_you_mean(name: str, choices: list[str], prefix: str) -> str:
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(prefix + c for c in close)}?)" if close else ""


_ARBITRARY = ConfigDict(arbitrary_types_allowed=True)


@lru_cache(maxsize=64)
def _adapter(tp: Any) -> TypeAdapter[Any]:
    return TypeAdapter(tp, config=_ARBITRARY)


def coerce(name: str, value: Any, target: Callable[..., Any]) -> Any:
    """``value`` as the keyword or profile field ``name`` takes it (``"8"`` for an int),
    or InvalidConfig saying why it cannot be."""
    if name.startswith(GPU_PREFIX):
        tp = gpu_fields()[name[len(GPU_PREFIX):]]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidConfig(f"{name} takes numbers (got {value!r})")
    else:
        tp = _hints(target).get(name)
        if tp is None:
            return value
        # A comma separates values, so a tuple (e.g. frozen layers) is written a+b.
        if isinstance(value, str) and get_origin(tp) is tuple:
            value = tuple(value.split("+"))
    try:
        return _adapter(tp).validate_python(value)
    except ValidationError as exc:
        raise InvalidConfig(f"{name}={value!r}: {exc.errors()[0]['msg']}") from exc


def _hints(target: Callable[..., Any]) -> dict[str, Any]:
    try:
        return get_type_hints(target)
    except (NameError, TypeError):  # an annotation that does not resolve: take values as given
        return {}


def with_fields(device: DeviceProfile, overrides: dict[str, float]) -> DeviceProfile:
    """A copy of ``device`` with profile fields replaced (``memory_gib`` or
    ``matrix_tflops.bf16``), validated like a profile file; the name stays, so the device's
    calibration still applies."""
    data = device.model_dump()
    sources = dict(data["sources"])
    for name, value in overrides.items():
        field, _, key = name.partition(".")
        if field not in type(device).model_fields:
            raise InvalidConfig(f"{device.name} is a {data.get('kind', 'device')} profile and "
                                f"has no field {field}")
        data[field] = {**data[field], key: value} if key else value
        sources[name] = WHAT_IF_SOURCE
    data["sources"] = sources
    try:
        return type(device).model_validate(data)
    except ValidationError as exc:
        raise InvalidProfile(format_validation_error(f"{device.name} with {overrides}", exc)) \
            from exc


def is_number(value: object) -> bool:
    """A finite int or float (not a bool): what plots can put on an axis."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))
