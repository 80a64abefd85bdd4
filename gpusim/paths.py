"""Output files checked before any work starts: a plot or trace into a folder that does not
exist, onto a folder, or with a type nothing writes would otherwise fail only at the end."""

from __future__ import annotations

import argparse
import stat
from collections.abc import Callable
from pathlib import Path

FIGURES = (".png", ".svg", ".pdf")


def output_file(*suffixes: str) -> Callable[[str], str]:
    """An argparse type for a file to write, of one of ``suffixes``."""
    def check(text: str) -> str:
        path = Path(text)
        if path.suffix.lower() not in suffixes:
            raise argparse.ArgumentTypeError(
                f"{text}: write a {', '.join(suffixes)} file (the name says which)")
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            raise argparse.ArgumentTypeError(f"{text}: the folder {parent} does not exist")
        return text
    check.__name__ = "output file"
    return check


figure = output_file(*FIGURES)
trace = output_file(".json")


def names_a_file(text: str) -> bool:
    """Whether ``text`` is the path of an existing file; False for what no file system takes
    (a name over 255 bytes, a NUL) rather than an OSError."""
    try:
        return Path(text).is_file()
    except (OSError, ValueError):
        return False


def check_regular_file(path: Path, largest: int, error: type[Exception],
                       what: str = "file") -> None:
    """Raise ``error`` unless ``path`` is a regular file of at most ``largest`` bytes: a
    folder, a FIFO or a device would otherwise fail late, block or never end. ``what``
    names the kind of file no larger one is."""
    try:
        info = path.stat()
    except FileNotFoundError as exc:
        raise error(f"{path}: no such file") from exc
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror})") from exc
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{path}: not a regular file")
    if info.st_size > largest:
        raise error(f"{path}: {info.st_size:,} bytes is far larger than any {what}")
