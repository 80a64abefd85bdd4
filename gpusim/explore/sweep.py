"""What-if sweeps: one estimate per point of a grid of settings, in parallel, resumable.

>>> from gpusim.explore.sweep import sweep
>>> result = sweep({"model": "mnist-mlp", "gpu": "h100-sxm", "precision": "bf16"},
...                {"batch_size": [64, 128]}, workers=1)
>>> [row["batch_size"] for row in result.rows], all(row["fits"] for row in result.rows)
([64, 128], True)

A point that cannot run (out of memory, a precision the device lacks, a batch that does not
divide) is an answer: its row says ``fits`` false with the error, and the sweep goes on. Other
exceptions are bugs and stop the sweep; points finished before stay in the results file.
"""

from __future__ import annotations

import csv
import fcntl
import importlib
import io
import itertools
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, TextIO

from gpusim.errors import GpusimError, InvalidConfig, MissingDependency, OutOfMemory
from gpusim.estimation import estimate, resolve_model
from gpusim.explore import values
from gpusim.hardware.catalog import load_device
from gpusim.hardware.profile import DeviceProfile
from gpusim.workload.model import Model

METRICS = ("step_time_s", "samples_per_s", "tokens_per_s", "time_to_train_s", "cost_usd",
           "energy_kwh", "peak_memory_bytes", "memory_free_bytes", "mfu", "fits", "error")
"""The columns every point gets after its varied values; ``fits`` and ``error`` say whether
it ran. A point out of memory keeps the memory it would need in ``peak_memory_bytes``, and
how much it is short by as a negative ``memory_free_bytes``."""

Executor = Literal["local", "dask", "ray"]
Progress = Callable[[int, int], None]
"""Called with (points done, points in all): once before the first point runs (done counts
points resumed from the results file), then after each point."""


@dataclass(frozen=True)
class SweepResult:
    """Every point of a sweep in grid order (the last varied field changes fastest)."""

    fields: tuple[str, ...]
    rows: tuple[dict[str, Any], ...]
    resumed: int = 0  # points read back from an earlier run's results file

    @property
    def infeasible(self) -> int:
        return sum(not row["fits"] for row in self.rows)

    def column(self, name: str) -> list[Any]:
        return [row[name] for row in self.rows]

    def inert_fields(self) -> list[str]:
        """Varied fields whose values changed no metric of any point (the other varied
        fields held fixed): fields this job does not use."""
        inert = []
        for field in self.fields:
            others = [f for f in self.fields if f != field]
            outcomes: dict[tuple[Any, ...], set[tuple[Any, ...]]] = {}
            for row in self.rows:
                key = tuple(str(row[f]) for f in others)
                outcomes.setdefault(key, set()).add(tuple(row[m] for m in METRICS))
            if len({str(row[field]) for row in self.rows}) > 1 and all(
                    len(seen) == 1 for seen in outcomes.values()):
                inert.append(field)
        return inert


# Points a sweep runs unless told otherwise: at tens of milliseconds a point on a few cores,
# about ten minutes of work.
MAX_POINTS = 10_000


def grid(base: Mapping[str, Any], vary: Mapping[str, Sequence[Any]],
         target: Callable[..., Any] = estimate,
         max_points: int = MAX_POINTS) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Every point: (its varied values as given, every setting as ``target`` takes it).

    Names and values are checked here, before anything runs, so a typo costs no points; a
    grid of more than ``max_points`` points is refused before it is built.
    """
    if not vary:
        raise InvalidConfig("nothing to vary: give at least one --vary NAME=VALUES")
    size = math.prod(len(options) for options in vary.values())
    if size > max_points:
        raise InvalidConfig(f"the grid has {size:,} points, more than the {max_points:,} a "
                            f"sweep runs by default (about ten minutes of work); vary fewer "
                            f"values, or raise the limit with --max-points")
    for name in [*base, *vary]:
        values.check_name(name, target)
    for name, options in vary.items():
        if isinstance(options, str) or not options:
            raise InvalidConfig(f"{name} needs a list of values to vary over (got {options!r})")
        seen = [str(v) for v in options]
        if len(set(seen)) != len(seen):
            raise InvalidConfig(f"{name}: a value is given twice ({', '.join(seen)})")
    missing = [k for k in values.required(target) if k not in base and k not in vary]
    if missing:
        raise InvalidConfig(f"a sweep needs {', '.join(missing)}: give it fixed (e.g. "
                            f"--{missing[0].replace('_', '-')}) or varied")
    fixed = {k: values.coerce(k, v, target) for k, v in base.items() if k not in vary}
    axes = [[(v, values.coerce(k, v, target)) for v in options] for k, options in vary.items()]
    points = []
    for combo in itertools.product(*axes):
        settings = {**fixed, **{k: typed for k, (_, typed) in zip(vary, combo, strict=True)}}
        points.append((tuple(raw for raw, _ in combo), settings))
    return points


# Per worker process: a zoo model or profile is built once, not once per point.
@lru_cache(maxsize=64)
def _model(name: str, seq_len: int | None) -> Model:
    return resolve_model(name, seq_len)


@lru_cache(maxsize=64)
def _device(name: str, overrides: tuple[tuple[str, float], ...]) -> DeviceProfile:
    device = load_device(name)
    return values.with_fields(device, dict(overrides)) if overrides else device


def run_point(settings: dict[str, Any]) -> dict[str, Any]:
    """The metrics of one point (``METRICS``); a domain error is recorded, not raised."""
    prefix = values.GPU_PREFIX
    kwargs = {k: v for k, v in settings.items() if not k.startswith(prefix)}
    overrides = tuple(sorted((k[len(prefix):], v) for k, v in settings.items()
                             if k.startswith(prefix)))
    try:
        if isinstance(kwargs.get("model"), str):
            kwargs["model"] = _model(kwargs["model"], kwargs.get("seq_len"))
        gpu = kwargs.get("gpu")
        if isinstance(gpu, str):
            kwargs["gpu"] = _device(gpu, overrides)
        elif isinstance(gpu, DeviceProfile) and overrides:
            kwargs["gpu"] = values.with_fields(gpu, dict(overrides))
        elif overrides:
            raise InvalidConfig("gpu.FIELD values need a --gpu to change")
        result = estimate(**kwargs)
    except OutOfMemory as exc:
        row = _failed(exc, exc.peak_bytes)  # the same measure as points that fit
        row["memory_free_bytes"] = exc.available_bytes - exc.required_bytes
        return row
    except GpusimError as exc:
        return _failed(exc, None)
    step = result.step
    return {"step_time_s": step.step_time_s, "samples_per_s": step.samples_per_s,
            "tokens_per_s": step.tokens_per_s, "time_to_train_s": result.time_to_train_s,
            "cost_usd": result.cost_usd, "energy_kwh": result.energy_kwh,
            "peak_memory_bytes": step.peak_memory_bytes,
            "memory_free_bytes": step.memory_free_bytes, "mfu": step.mfu, "fits": True,
            "error": None}


def _failed(exc: GpusimError, peak_memory_bytes: float | None) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(METRICS)
    # One line: messages with a breakdown span several, and a results file wants one cell.
    row.update(peak_memory_bytes=peak_memory_bytes, fits=False,
               error=f"{type(exc).__name__}: {' '.join(exc.summary.split())}")
    return row


Jobs = list[tuple[int, dict[str, Any]]]


PARENT_POLL_S = 1.0


def _exit_with_parent(parent: int) -> None:
    """In each pool worker: exit once the sweep that started it is gone (killed with -9,
    say), rather than live on orphaned."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="gpusim-parent-watch").start()


def _local(jobs: Jobs, workers: int) -> Iterator[tuple[int, dict[str, Any]]]:
    if workers <= 1 or len(jobs) <= 1:
        for index, settings in jobs:
            yield index, run_point(settings)
        return
    pool = ProcessPoolExecutor(max_workers=min(workers, len(jobs)),
                               initializer=_exit_with_parent, initargs=(os.getpid(),))
    try:
        futures: dict[Future[dict[str, Any]], int] = {
            pool.submit(run_point, settings): index for index, settings in jobs}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=futures.__getitem__):
                yield futures[future], future.result()
    finally:
        # On an interrupt, drop queued points rather than finish them unsaved.
        pool.shutdown(wait=True, cancel_futures=True)


def _optional(module: str, extra: str, executor: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(f"--executor {executor} needs {extra}: "
                                f"pip install '{extra}' (or leave --executor local)") from exc


def _dask(jobs: Jobs, scheduler: str | None) -> Iterator[tuple[int, dict[str, Any]]]:
    distributed = _optional("dask.distributed", "dask[distributed]", "dask")
    if not scheduler:
        raise InvalidConfig("--executor dask runs on an existing cluster: give its "
                            "--scheduler ADDRESS (e.g. tcp://10.0.0.5:8786)")
    return _dask_results(distributed, jobs, scheduler)


def _dask_results(distributed: ModuleType, jobs: Jobs,
                  scheduler: str) -> Iterator[tuple[int, dict[str, Any]]]:
    with distributed.Client(scheduler) as client:
        futures = client.map(run_point, [settings for _, settings in jobs], pure=False)
        index = {f.key: i for f, (i, _) in zip(futures, jobs, strict=True)}
        for future in distributed.as_completed(futures):
            yield index[future.key], future.result()


def _ray(jobs: Jobs, address: str | None) -> Iterator[tuple[int, dict[str, Any]]]:
    ray = _optional("ray", "ray", "ray")
    return _ray_results(ray, jobs, address)


def _ray_results(ray: ModuleType, jobs: Jobs,
                 address: str | None) -> Iterator[tuple[int, dict[str, Any]]]:
    ray.init(address=address or "auto", ignore_reinit_error=True)
    remote = ray.remote(run_point)
    refs = {remote.remote(settings): index for index, settings in jobs}
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for ref in ready:
            yield refs[ref], ray.get(ref)


def row_key(varied: Sequence[Any]) -> tuple[str, ...]:
    """How a point is found in a results file: its varied values as a CSV cell spells them."""
    return tuple("" if v is None else str(v) for v in varied)


class ResultsFile:
    """A sweep's results file, written point by point so that an interrupted sweep loses none.

    CSV and JSON lines (.jsonl) grow in place. A .json file is one array, which cannot grow,
    so points go to a JSON-lines ``<name>.partial`` beside it until the sweep ends. The end
    rewrites the file in grid order (the same bytes however the points were scheduled),
    keeping rows of points this sweep no longer has.
    """

    def __init__(self, path: Path, columns: list[str]) -> None:
        self.format = path.suffix.lower().lstrip(".")
        if self.format not in ("csv", "json", "jsonl"):
            raise InvalidConfig(f"--out {path}: write results to a .csv, .json or .jsonl file")
        self.path, self.columns = path, columns
        self.journal = path.with_name(path.name + ".partial") if self.format == "json" else path
        self._fields = columns[: len(columns) - len(METRICS)]
        self._earlier: dict[tuple[str, ...], dict[str, Any]] = {}
        self._handle: TextIO | None = None
        self._lock: tuple[Path, TextIO] | None = None

    def load(self) -> dict[tuple[str, ...], dict[str, Any]]:
        """The metrics of points finished by earlier runs, by ``row_key``."""
        rows: list[Any] = []
        if self.format == "json" and self.path.exists():
            try:
                rows += json.loads(self.path.read_text() or "[]")
            except json.JSONDecodeError as exc:
                raise InvalidConfig(f"{self.path} is not a sweep's results ({exc})") from exc
        if self.journal.exists():
            # A line cut short by an interrupt is dropped; that point runs again.
            text = self.journal.read_text()
            text = text[: text.rfind("\n") + 1]
            if self.format == "csv":
                rows += list(csv.DictReader(io.StringIO(text)))
            else:
                rows += [json.loads(line) for line in text.splitlines() if line.strip()]
        for row in rows:
            if not isinstance(row, dict) or list(row) != self.columns:
                found = ", ".join(row) if isinstance(row, dict) else type(row).__name__
                raise InvalidConfig(
                    f"{self.path} holds another sweep's results (columns {found}); this sweep "
                    f"writes {', '.join(self.columns)}: give another --out")
            self._earlier[row_key([row[f] for f in self._fields])] = row
        return {key: _typed(row) for key, row in self._earlier.items()}

    def lock(self) -> None:
        """Hold ``<file>.lock`` for the sweep: a second sweep writing the same results file
        is refused rather than let the two overwrite each other."""
        lock_path = self.path.with_name(self.path.name + ".lock")
        handle = lock_path.open("a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            handle.close()
            raise InvalidConfig(f"another sweep is writing {self.path}; wait for it to end, "
                                f"or give another --out") from exc
        self._lock = (lock_path, handle)

    def unlock(self) -> None:
        if self._lock is not None:
            lock_path, handle = self._lock
            lock_path.unlink(missing_ok=True)
            handle.close()
            self._lock = None

    def open(self) -> None:
        """Start the journal afresh with the rows read (atomically), then append to it."""
        self._write(self.journal, list(self._earlier.values()), final=False)
        self._handle = self.journal.open("a", newline="", encoding="utf-8")

    def append(self, row: dict[str, Any]) -> None:
        assert self._handle is not None
        self._handle.write(self._line(row))
        self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def finish(self, rows: list[dict[str, Any]]) -> None:
        """Write every row in grid order, then rows of other points read from the file."""
        mine = {row_key([row[f] for f in self._fields]) for row in rows}
        others = [row for key, row in self._earlier.items() if key not in mine]
        self._write(self.path, rows + others, final=True)
        if self.journal != self.path:
            self.journal.unlink(missing_ok=True)

    def _line(self, row: dict[str, Any]) -> str:
        ordered = {c: row[c] for c in self.columns}
        if self.format != "csv":
            return json.dumps(ordered, default=str) + "\n"
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerow(ordered.values())
        return buffer.getvalue()

    def _write(self, path: Path, rows: list[dict[str, Any]], *, final: bool) -> None:
        lines = [self._line(row) for row in rows]
        if self.format == "csv":
            lines.insert(0, ",".join(self.columns) + "\n")
        elif self.format == "json" and final:
            lines = ["[\n", ",\n".join(line.rstrip("\n") for line in lines), "\n]\n"]
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text("".join(lines), encoding="utf-8")
        os.replace(temporary, path)


def _typed(row: dict[str, Any]) -> dict[str, Any]:
    """Metrics as a CSV cell or JSON value gave them -> numbers, a bool, None."""
    out: dict[str, Any] = {}
    for name in METRICS:
        value = row[name]
        if name == "fits":
            out[name] = value in (True, "True", "true")
        elif name == "error":
            out[name] = value or None
        else:
            out[name] = None if value in (None, "") else float(value)
    return out


def sweep(base: Mapping[str, Any], vary: Mapping[str, Sequence[Any]], *,
          out: str | Path | None = None, workers: int | None = None,
          executor: Executor = "local", scheduler: str | None = None,
          progress: Progress | None = None, max_points: int = MAX_POINTS) -> SweepResult:
    """Estimate every combination of ``vary`` (name -> values) on top of ``base``.

    Names are keywords of ``gpusim.estimation.estimate`` or ``gpu.FIELD`` profile fields (see
    ``gpusim.explore.values``). With ``out`` (.csv, .json or .jsonl) each point is written as
    it finishes, and a rerun with the same ``out`` skips the points it holds (matched by
    their varied values, so change ``out`` when you change a fixed setting).
    ``executor`` "local" uses ``workers`` processes (default: every CPU; 1 runs in this
    process); "dask" and "ray" use the cluster at ``scheduler``. A grid of more than
    ``max_points`` points is refused before it is built.
    """
    # estimate by the module's name: a test may stand in for it
    points = grid(base, vary, estimate, max_points)
    fields = tuple(vary)
    store = ResultsFile(Path(out), [*fields, *METRICS]) if out is not None else None
    if store is not None:
        store.lock()
        try:
            return _run(points, fields, store, workers, executor, scheduler, progress)
        finally:
            store.unlock()
    return _run(points, fields, None, workers, executor, scheduler, progress)


def _run(points: list[tuple[tuple[Any, ...], dict[str, Any]]], fields: tuple[str, ...],
         store: ResultsFile | None, workers: int | None, executor: Executor,
         scheduler: str | None, progress: Progress | None) -> SweepResult:
    """The points not yet in ``store`` run, each written as it finishes."""
    rows: list[dict[str, Any] | None] = [None] * len(points)
    if store is not None:
        earlier = store.load()
        for i, (raw, _) in enumerate(points):
            found = earlier.get(row_key(raw))
            if found is not None:
                rows[i] = {**dict(zip(fields, raw, strict=True)), **found}
    resumed = sum(row is not None for row in rows)
    jobs = [(i, settings) for i, (_, settings) in enumerate(points) if rows[i] is None]
    if progress:
        progress(resumed, len(points))
    runs = {"local": lambda: _local(jobs, workers or os.cpu_count() or 1),
            "dask": lambda: _dask(jobs, scheduler), "ray": lambda: _ray(jobs, scheduler)}
    if executor not in runs:
        raise InvalidConfig(f"unknown executor {executor!r}; use local, dask or ray")
    # Made before the file is touched: a missing dask or ray fails here.
    results = runs[executor]() if jobs else iter(())
    try:
        if store is not None:
            store.open()
        done = resumed
        for index, metrics in results:
            row = {**dict(zip(fields, points[index][0], strict=True)), **metrics}
            rows[index] = row
            if store is not None:
                store.append(row)
            done += 1
            if progress:
                progress(done, len(points))
    finally:
        if store is not None:
            store.close()
    final = tuple(row for row in rows if row is not None)
    if store is not None:
        store.finish(list(final))
    return SweepResult(fields, final, resumed)
