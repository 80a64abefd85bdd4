"""Load hardware profiles from YAML and find them by name or alias.

Names are matched loosely (case, spaces, dashes and underscores ignored), so ``h100``,
``h100-sxm`` and ``H100 SXM5 80GB`` all resolve when the profile lists them. An unknown name
raises ``UnknownHardware`` with the closest matches.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from gpusim.data import data_dir
from gpusim.errors import InvalidProfile, UnknownHardware
from gpusim.hardware.profile import (
    CPUProfile,
    DeviceProfile,
    GPUProfile,
    HardwareProfile,
    LinkProfile,
    Profile,
    SystemProfile,
    unsourced_problem,
)
from gpusim.paths import check_regular_file

_KINDS: dict[str, type[HardwareProfile]] = {
    "gpu": GPUProfile,
    "cpu": CPUProfile,
    "link": LinkProfile,
    "system": SystemProfile,
}
_FOLDERS = {"gpus": "gpu", "cpus": "cpu", "links": "link", "systems": "system"}

P = TypeVar("P", GPUProfile, CPUProfile, DeviceProfile, LinkProfile, SystemProfile)


def profiles_dir() -> Path:
    """Where the shipped profiles live; ``GPUSIM_PROFILES_DIR`` overrides it."""
    override = os.environ.get("GPUSIM_PROFILES_DIR")
    if override:
        return Path(override)
    return data_dir("hardware_profiles")


def normalize(name: str) -> str:
    """The key a name is matched by: lowercase letters and digits only."""
    return re.sub(r"[^a-z0-9.]", "", name.lower())


# libyaml's parser where PyYAML was built with it (fifteen times faster over the shipped
# profiles, stacks and models); the same Python constructors and resolvers either way.
_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[valid-type,misc]
    """SafeLoader that keeps dates as strings (``2024-05`` and ``2024-05-01`` alike)."""


_Loader.yaml_implicit_resolvers = {
    key: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _mapping_without_duplicates(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    keys = [loader.construct_object(k, deep=True) for k, _ in node.value]
    repeated = sorted({str(k) for k in keys if keys.count(k) > 1})
    if repeated:
        raise yaml.constructor.ConstructorError(
            None, None, f"{', '.join(repeated)} given more than once", node.start_mark)
    mapping: dict[Any, Any] = loader.construct_mapping(node, deep=True)
    return mapping


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                        _mapping_without_duplicates)

# A profile, model or stack file is a few kilobytes; anything this large is not one.
LARGEST_INPUT_FILE = 10 * 2**20


def read_text_file(path: Path) -> str:
    """The text of a regular UTF-8 file of reasonable size, or InvalidProfile saying why not
    (a folder, a FIFO or a device would otherwise fail late, block or never end)."""
    check_regular_file(path, LARGEST_INPUT_FILE, InvalidProfile, "profile, model or stack file")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidProfile(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    except OSError as exc:
        raise InvalidProfile(f"{path}: cannot be read ({exc.strerror})") from exc


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping from ``path``, or InvalidProfile naming the file and the problem."""
    text = read_text_file(path)
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise InvalidProfile(f"{path}: not valid YAML ({exc})".replace("\n", " ")) from exc
    if not isinstance(data, dict):
        raise InvalidProfile(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    return data


def format_validation_error(source: str, exc: ValidationError,
                            model: type[BaseModel] | None = None) -> str:
    """One problem per broken field, every one at once: where it is and which rule it breaks.

    Given the ``model`` that was validated, an unknown key names the closest field the model
    has there (``memory_bandwith_gb_s`` -> ``memory_bandwidth_gb_s``), and the "Field required"
    of the field it was meant for is left out (one slip, one problem). A value outside a fixed
    set (a precision, a kind) names the closest allowed one.
    """
    errors = exc.errors()
    hints: dict[int, str] = {}
    meant: set[tuple[str | int, ...]] = set()  # required fields an unknown key stands in for
    for i, err in enumerate(errors):
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden" and loc and model is not None:
            known = _fields_at(model, loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            if close:
                hints[i] = f" (did you mean {close[0]}?)"
                meant.add((*loc[:-1], close[0]))
            elif known and len(known) <= 8:
                hints[i] = f" (known here: {', '.join(known)})"
        elif err["type"] == "literal_error" and isinstance(err.get("input"), str):
            allowed = re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", "")))
            close = difflib.get_close_matches(err["input"], allowed, n=1)
            if close:
                hints[i] = f" (did you mean {close[0]}?)"
    problems = []
    for i, err in enumerate(errors):
        if err["type"] == "missing" and tuple(err["loc"]) in meant:
            continue
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        problems.append(f"{where}: {err['msg']}{hints.get(i, '')}")
    return f"{source}: " + "; ".join(problems)


def _fields_at(model: type[BaseModel], loc: tuple[str | int, ...]) -> list[str]:
    """The field names of the model found at ``loc`` inside ``model`` (through lists, dicts
    and optionals), or none when ``loc`` leads to no model."""
    annotation: Any = model
    for part in loc:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(str(part))
            if field is None:
                return []
            annotation = field.annotation
        elif get_origin(annotation) in (list, tuple) and isinstance(part, int):
            annotation = get_args(annotation)[0]
        elif get_origin(annotation) is dict:
            annotation = get_args(annotation)[1]
        else:
            return []
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(annotation.model_fields)
    return []


def _unwrap(annotation: Any) -> Any:
    """``X`` of ``Annotated[X, ...]`` and of ``X | None``; anything else as it is."""
    while True:
        origin = get_origin(annotation)
        args = [a for a in get_args(annotation) if a is not type(None)]
        if origin is Annotated or (origin in (Union, UnionType) and len(args) == 1):
            annotation = args[0]
        else:
            return annotation


def parse_profile(data: dict[str, Any], source: str, kind: str | None = None) -> HardwareProfile:
    """Validate one profile mapping; ``kind`` defaults to the mapping's own ``kind`` field."""
    kind = kind or data.get("kind")
    if kind not in _KINDS:
        raise InvalidProfile(
            f"{source}: kind must be one of {', '.join(_KINDS)} (got {data.get('kind')!r})"
        )
    data = {**data, "kind": kind}
    model = _KINDS[kind]
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message = format_validation_error(source, exc, model)
        # The rules on a whole profile run only once every field is valid; the sources rule
        # needs only the file, so a file with a broken field learns its unsourced figures in
        # the same run. (A whole-profile error has an empty loc and means it already ran.)
        sources = data.get("sources", {})
        if all(err["loc"] for err in exc.errors()) and isinstance(sources, dict):
            unsourced = unsourced_problem(model, data, sources)
            if unsourced:
                message += f"; {unsourced}"
        raise InvalidProfile(message) from exc


def load_profile_file(path: str | Path) -> HardwareProfile:
    """Load and validate one profile file (what ``gpusim profiles check`` does)."""
    path = Path(path)
    data = read_yaml(path)
    folder_kind = _FOLDERS.get(path.parent.name)
    name = data.get("name")
    misnamed = (path.parent.name in _FOLDERS and isinstance(name, str) and path.stem != name)
    try:
        profile = parse_profile(data, str(path), data.get("kind", folder_kind))
    except InvalidProfile as exc:
        if misnamed:  # said with the other problems, not on the next run
            raise InvalidProfile(f"{exc}; file name must match name {name!r}") from exc
        raise
    if misnamed:
        raise InvalidProfile(f"{path}: file name must match name {profile.name!r}")
    return profile


class Catalog:
    """Every profile of a directory tree, indexed by normalized name and alias."""

    def __init__(self, profiles: list[HardwareProfile]) -> None:
        self._by_name: dict[str, HardwareProfile] = {}
        self._index: dict[str, HardwareProfile] = {}
        for profile in profiles:
            if profile.name in self._by_name:
                raise InvalidProfile(f"two profiles are named {profile.name!r}")
            self._by_name[profile.name] = profile
        for profile in profiles:
            for key in {normalize(profile.name), normalize(profile.full_name)} | {
                normalize(a) for a in profile.aliases
            }:
                other = self._index.get(key)
                if other is not None and other is not profile:
                    raise InvalidProfile(
                        f"{key!r} names both {other.name!r} and {profile.name!r}"
                    )
                self._index[key] = profile

    @classmethod
    def from_dir(cls, root: Path) -> Catalog:
        profiles: list[HardwareProfile] = []
        for folder in _FOLDERS:
            for path in sorted((root / folder).glob("*.yaml")):
                profiles.append(load_profile_file(path))
        return cls(profiles)

    def find(self, name: str) -> HardwareProfile:
        """A profile of any kind by name or alias."""
        found = self._index.get(normalize(name))
        if found is not None:
            return found
        return self.get(name, GPUProfile)  # raises with the closest GPU names

    def all(self, kind: type[P]) -> list[P]:
        return [p for p in self._by_name.values() if isinstance(p, kind)]

    def get(self, name: str, kind: type[P]) -> P:
        found = self._index.get(normalize(name))
        if isinstance(found, kind):
            return found
        candidates = [p for p in self._by_name.values() if isinstance(p, kind)]
        keys = _alias_keys(candidates)
        close = difflib.get_close_matches(normalize(name), list(keys), n=3, cutoff=0.5)
        suggestions = sorted({keys[c] for c in close})
        label = _LABELS.get(kind, "hardware")
        hint = (
            f"; did you mean {' or '.join(suggestions)}?"
            if suggestions
            else f"; `gpusim profiles list` shows the {len(candidates)} known"
        )
        raise UnknownHardware(f"unknown {label} {name!r}{hint}")


def _alias_keys(profiles: Sequence[Profile]) -> dict[str, str]:
    """Normalized name or alias -> profile name, for did-you-mean suggestions."""
    keys: dict[str, str] = {}
    for profile in profiles:
        for alias in [profile.name, *profile.aliases]:
            keys[normalize(alias)] = profile.name
    return keys


_LABELS: dict[type[Any], str] = {
    GPUProfile: "GPU",
    CPUProfile: "CPU",
    DeviceProfile: "device (GPU or CPU)",
    LinkProfile: "link",
    SystemProfile: "system",
}


@lru_cache(maxsize=4)
def _catalog_at(root: str) -> Catalog:
    return Catalog.from_dir(Path(root))


def catalog() -> Catalog:
    """The catalog of the shipped profiles (loaded once per process)."""
    return _catalog_at(str(profiles_dir()))


def _load(name_or_path: str, kind: type[P], what: str) -> P:
    """A profile of ``kind`` by name or alias, or from a YAML file path (files work wherever
    names do)."""
    if name_or_path.endswith((".yaml", ".yml")):
        profile = load_profile_file(name_or_path)
        if not isinstance(profile, kind):
            raise InvalidProfile(f"{name_or_path}: is a {profile.kind} profile, not {what}")
        return profile
    return catalog().get(name_or_path, kind)


def load_device(name_or_path: str) -> DeviceProfile:
    """A GPU or CPU by name or alias, or from a YAML file path."""
    return _load(name_or_path, DeviceProfile, "a GPU or CPU")


def load_gpu(name_or_path: str) -> GPUProfile:
    return _load(name_or_path, GPUProfile, "a GPU")


def host_link(gpu: GPUProfile) -> LinkProfile:
    """The PCIe link between ``gpu`` and its host: the catalog's link of its generation
    (PCIe 5 for anything newer)."""
    return catalog().get(f"pcie{min(gpu.pcie_gen, 5)}", LinkProfile)


def load_cpu(name_or_path: str) -> CPUProfile:
    return _load(name_or_path, CPUProfile, "a CPU")


def load_link(name_or_path: str) -> LinkProfile:
    return _load(name_or_path, LinkProfile, "a link")


def load_system(name_or_path: str) -> SystemProfile:
    return _load(name_or_path, SystemProfile, "a system")
