"""Numbers at the boundary: every number a user types is checked here (finite, in range,
plain ASCII digits) before any work starts, and no NaN or Infinity ever reaches JSON output.

The ``argparse`` types below raise ``argparse.ArgumentTypeError``, which argparse turns into
a one-line usage error (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any

# Counts beyond this (a batch, a sequence, a GPU count) are typing slips, not jobs.
LARGEST_COUNT = 10**12


def _number(text: str, kind: str) -> float:
    if not text.isascii() or not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not a number")
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number ({kind})")
    return value


def integer(least: int) -> Callable[[str], int]:
    """A whole number of at least ``least`` (and at most LARGEST_COUNT)."""
    def parse(text: str) -> int:
        if not text.isascii() or not text.strip().lstrip("+-").isdigit():
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is below the least allowed, {least}")
        if value > LARGEST_COUNT:
            raise argparse.ArgumentTypeError(f"{value} is beyond reason (at most "
                                             f"{LARGEST_COUNT:.0e})")
        return value
    parse.__name__ = f"integer >= {least}"
    return parse


def real(least: float, *, above: bool = False, most: float | None = None,
         below: bool = False) -> Callable[[str], float]:
    """A finite number >= ``least`` (> with ``above``), and <= ``most`` (< with ``below``)."""
    def parse(text: str) -> float:
        value = _number(text, "a real value")
        if value < least or (above and value == least):
            raise argparse.ArgumentTypeError(
                f"{text} must be {'above' if above else 'at least'} {least:g}")
        if most is not None and (value > most or (below and value == most)):
            raise argparse.ArgumentTypeError(
                f"{text} must be {'below' if below else 'at most'} {most:g}")
        return value
    parse.__name__ = "number"
    return parse


count = integer(1)  # batches, lengths, GPU counts, steps
count0 = integer(0)  # loader workers
positive = real(0.0, above=True)  # epochs, tokens, years, dollars
nonnegative = real(0.0)
fraction = real(0.0, most=1.0, below=True)  # a slowdown in [0, 1)
share = real(0.0, above=True, most=1.0)  # a utilization in (0, 1]


def finite_or_none(value: Any) -> Any:
    """``value`` with every NaN or infinite float (however deep) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """JSON text that is valid JSON: no NaN or Infinity (they become null)."""
    return json.dumps(finite_or_none(value), allow_nan=False, **kwargs)


def count_list(text: str) -> tuple[int, ...]:
    """Comma-separated counts, e.g. ``7,8,8,7``."""
    items = text.split(",")
    if not text.strip() or any(not item.strip() for item in items):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of counts like 7,8,8,7")
    return tuple(count(item.strip()) for item in items)
