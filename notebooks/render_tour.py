"""Render the README's tour pictures from the notebooks.

Runs each notebook (all of them, or those named) in a fresh Jupyter kernel with notebooks/ as
the working directory, and writes the first PNG output of its cell tagged ``tour`` (cell
metadata tags) to docs/tour/<notebook name>.png. The notebooks themselves are not changed.

    python notebooks/render_tour.py                      # every notebook
    python notebooks/render_tour.py 03-what-if-scenarios.ipynb

Needs the test extra (nbclient, nbformat, ipykernel): pip install -e ".[test]".
"""

from __future__ import annotations

import argparse
import base64
import sys
import time
from pathlib import Path
from typing import Any

import nbclient
import nbformat

NOTEBOOKS_DIR = Path(__file__).resolve().parent
TOUR_DIR = NOTEBOOKS_DIR.parent / "docs" / "tour"
TAG = "tour"
CELL_TIMEOUT_S = 120


class NoPicture(Exception):
    """A tagged cell that shows no figure: the tour would go stale, so say so."""


def tour_png(nb: Any) -> bytes | None:
    """The first PNG output of the notebook's first cell tagged ``tour``; None without one."""
    for cell in nb.cells:
        if cell.cell_type == "code" and TAG in cell.get("metadata", {}).get("tags", []):
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                if "image/png" in data:
                    return base64.b64decode(data["image/png"])
            raise NoPicture(f"the cell tagged {TAG!r} produced no PNG figure")
    return None


def render(path: Path, out_dir: Path) -> Path | None:
    """Execute ``path`` and write its tour picture; None when no cell is tagged."""
    nb = nbformat.read(path, as_version=4)
    if not any(TAG in c.get("metadata", {}).get("tags", []) for c in nb.cells):
        return None
    nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS_DIR)}}).execute()
    png = tour_png(nb)
    assert png is not None
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{path.stem}.png"
    target.write_bytes(png)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to render (default: every notebooks/*.ipynb)")
    parser.add_argument("--out", type=Path, default=TOUR_DIR,
                        help=f"folder for the pictures (default {TOUR_DIR})")
    args = parser.parse_args(argv)
    paths = [p if p.is_absolute() or p.exists() else NOTEBOOKS_DIR / p
             for p in args.notebooks] or sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
    for path in paths:
        start = time.perf_counter()
        try:
            target = render(path, args.out)
        except NoPicture as exc:
            print(f"{path.name}: {exc}", file=sys.stderr)
            return 1
        took = f"{time.perf_counter() - start:.1f} s"
        if target is None:
            print(f"{path.name}: no cell tagged {TAG!r}, nothing written")
        else:
            shown = target.relative_to(NOTEBOOKS_DIR.parent) \
                if target.is_relative_to(NOTEBOOKS_DIR.parent) else target
            print(f"{path.name}: wrote {shown} ({took})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
