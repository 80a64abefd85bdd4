"""Where the command line prints tables: standard output, fitted to the terminal's width on
a terminal, and at the table's own width, without trailing blanks, in a pipe or a file (no
wrapped rows in a log)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from gpusim.tables import render


def show(table: Table) -> None:
    if sys.stdout.isatty():
        Console(highlight=False, file=sys.stdout).print(table)
    else:
        print(render(table))
