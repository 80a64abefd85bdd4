"""The command line: one parser, a module per command, and one way to fail.

Domain errors (unknown names, bad files, jobs that do not fit) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from gpusim.cli import (
    compare,
    estimate,
    kernel,
    models,
    profiles,
    scaling,
    search,
    sweep,
    validation,
)
from gpusim.errors import GpusimError, OutOfMemory

# In the order `gpusim --help` lists them.
COMMANDS = (estimate, profiles, models, validation, sweep, search, compare, scaling, kernel)


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (the usage of estimate alone runs to forty
    lines, which buried the one that says what is wrong)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gpusim",
        description="Predict deep-learning training time and cost on GPUs and CPUs.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        name: handler for command in COMMANDS for name, handler in command.HANDLERS.items()}
    try:
        return handlers[args.command](args)
    except BrokenPipeError:
        # The reader stopped early (| head): nothing more to say, and nothing to flush at
        # exit either (the recipe in Python's signal documentation).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OutOfMemory as exc:
        print(f"gpusim: error: {exc.message(cli=True)}", file=sys.stderr)
        return 2
    except GpusimError as exc:
        print(f"gpusim: error: {exc}", file=sys.stderr)
        return 2
