"""The command line: one parser, a module per command, and one way to fail.

Domain errors (unknown names, bad files, jobs that do not fit) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import NoReturn

from gpusim.errors import GpusimError, OutOfMemory

# The command modules of gpusim.cli, in the order `gpusim --help` lists them, and the
# commands each handles (its HANDLERS). A command imports its own module only: the others
# (the sweep, search and comparison machinery, the measurement runner) cost a third of a
# second that a single estimate need not pay.
COMMANDS = {"estimate": ("estimate", "memory"), "profiles": ("profiles",),
            "models": ("models",), "validation": ("measure", "calibrate", "validate"),
            "sweep": ("sweep",), "search": ("search",), "compare": ("compare",),
            "scaling": ("scaling",), "kernel": ("kernel",)}


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (the usage of estimate alone runs to forty
    lines, which buried the one that says what is wrong)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def command_modules(argv: Sequence[str] | None = None) -> list[ModuleType]:
    """The command modules ``argv`` needs: the named command's alone, or every one (no
    command named, as for ``gpusim --help``, or one misspelt, for argparse to list)."""
    named = next((a for a in argv or () if not a.startswith("-")), None)
    wanted = [module for module, names in COMMANDS.items() if named in names] or list(COMMANDS)
    return [importlib.import_module(f"gpusim.cli.{module}") for module in wanted]


def parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of ``argv``'s command (of every command when ``argv`` is None)."""
    p = _Parser(
        prog="gpusim",
        description="Predict deep-learning training time and cost on GPUs and CPUs.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for command in command_modules(argv):
        command.add_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    modules = command_modules(argv)
    args = parser(argv).parse_args(argv)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        name: handler for command in modules for name, handler in command.HANDLERS.items()}
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
