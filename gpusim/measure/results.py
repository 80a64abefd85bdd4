"""Measurement files: one JSON per device and suite, with a schema version and provenance.

Layout: ``{"schema_version", "suite": "micro" | "models", "device": profile name,
"provenance": {...}, "switches": {...}, "cases": [...]}``. Every case has an ``id`` and a
``kind``; timed results carry ``median_s``, ``p10_s``, ``p90_s``, ``repeats`` and ``inner``
(calls per timed sample). Measurements are data: written by the runner, never edited by hand.
This module needs no torch, so prediction and validation can read files anywhere.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpusim.data import data_dir
from gpusim.errors import InvalidMeasurement
from gpusim.paths import check_regular_file

SCHEMA_VERSION = 1
SUITES = ("micro", "models")


def write(path: str | Path, data: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return path


# Far beyond any suite (the models suite with every layer's rows is about 1 MB).
LARGEST_FILE = 256 * 2**20


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a measurement can hold")


def _read(path: Path) -> Any:
    """The JSON of a regular file of sane size, NaN and Infinity refused."""
    check_regular_file(path, LARGEST_FILE, InvalidMeasurement, "measurement file")
    try:
        return json.loads(path.read_bytes().decode("utf-8"), parse_constant=_no_constant)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidMeasurement(f"{path}: not a readable JSON file ({exc})") from exc


def read_json(path: str | Path) -> Any:
    """A measurement-side JSON file that is no suite (the GPU probes' output), read with the
    same checks as a suite's."""
    return _read(Path(path))


def _check_cases(path: Path, cases: Any) -> None:
    if not isinstance(cases, list):
        raise InvalidMeasurement(f"{path}: 'cases' must be a list")
    for i, case in enumerate(cases):
        if not isinstance(case, dict) or not isinstance(case.get("id"), str) \
                or not isinstance(case.get("kind"), str):
            raise InvalidMeasurement(f"{path}: case {i} needs a string id and kind")
        for key in ("median_s", "p10_s", "p90_s"):
            value = case.get(key)
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, (int, float)) or value <= 0):
                raise InvalidMeasurement(f"{path}: case {case['id']!r} has {key} {value!r}; "
                                         f"a time must be a positive number of seconds")


def load(path: str | Path, suite: str | None = None) -> dict[str, Any]:
    """Read and check a measurement file; ``suite`` demands micro or models."""
    path = Path(path)
    data = _read(path)
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        raise InvalidMeasurement(f"{path}: expected schema_version {SCHEMA_VERSION}")
    for key in ("suite", "device", "provenance", "cases"):
        if key not in data:
            raise InvalidMeasurement(f"{path}: missing {key!r}")
    if data["suite"] not in SUITES:
        raise InvalidMeasurement(f"{path}: unknown suite {data['suite']!r}")
    if suite is not None and data["suite"] != suite:
        raise InvalidMeasurement(f"{path} holds the {data['suite']} suite; this needs the "
                                 f"{suite} suite")
    if suite == "micro":
        _check_cases(path, data["cases"])
    if not data.get("switches", {}).get("rotary"):
        data["cases"] = [_without_rotary(case) for case in data["cases"]]
    return data


def _without_rotary(case: dict[str, Any]) -> dict[str, Any]:
    """A case as a runner before the ``rotary`` switch ran it: its transformer blocks
    applied no rotary embedding whatever the spec said, so no position encoding at all."""
    spec = case.get("model")
    if not isinstance(spec, dict) or \
            (spec.get("transformer") or {}).get("positions") != "rotary":
        return case
    return {**case, "model": {**spec, "transformer": {**spec["transformer"],
                                                      "positions": "none"}}}


def find(root: str | Path, suite: str, device: str | None = None,
         runs: bool = False) -> list[Path]:
    """Committed files of ``suite`` under ``root`` (measurements/<device>/<suite>.json),
    with ``runs`` also its repeat runs on other leases (<suite>-run<N>.json)."""
    root = Path(root)
    folder = device or "*"
    found = set(root.glob(f"{folder}/{suite}.json"))
    if runs:
        found |= set(root.glob(f"{folder}/{suite}-run*.json"))
    return sorted(found, key=lambda p: (p.parent.name, p.name != f"{suite}.json", p.name))


def measurements_dir() -> Path:
    """The shipped measurements/ folder (beside hardware_profiles/)."""
    return data_dir("measurements")


def display_path(path: str | Path) -> str:
    """A measurement file's path as committed (from measurements/ on), never a path of the
    machine it was read on."""
    parts = Path(path).resolve().parts
    if "measurements" in parts:
        return "/".join(parts[parts.index("measurements"):])
    return Path(path).name
