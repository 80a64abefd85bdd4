"""The notebooks: committed without outputs, and every one runs to the end with a figure.

Each notebook under notebooks/ is executed in a fresh Jupyter kernel (nbclient, the kernel
of this Python) with notebooks/ as the working directory, as a reader opening it would.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

try:
    import nbclient
    import nbformat
except ImportError as exc:  # fail each test, loudly, rather than skip or stop the whole run
    nbclient = nbformat = None
    MISSING = (f"the notebook tests need {exc.name} (the test extra): "
               "pip install -e '.[test]'")
else:
    MISSING = ""

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 120  # a cell; each notebook as a whole should take well under a minute
KERNEL = "python3"


def test_notebooks_exist() -> None:
    assert NOTEBOOKS, f"no notebooks found under {NOTEBOOKS_DIR}"


def _read(path: Path) -> Any:
    if MISSING:
        pytest.fail(MISSING, pytrace=False)
    return nbformat.read(path, as_version=nbformat.NO_CONVERT)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_without_outputs(path: Path) -> None:
    nb = _read(path)
    assert nb.nbformat == 4
    nbformat.validate(nb)
    dirty = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
             and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, (f"{path.name}: code cells {dirty} carry outputs or execution counts; "
                       "commit notebooks without outputs (Jupyter: Edit > Clear Outputs of All "
                       "Cells, then save)")


def _execute(path: Path) -> Any:
    nb = _read(path)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name=KERNEL,
                                     resources={"metadata": {"path": str(NOTEBOOKS_DIR)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        hint = ("\n(the kernel runs a Python without gpusim: see `jupyter kernelspec list`)"
                if "No module named 'gpusim'" in str(exc) else "")
        pytest.fail(f"{path.name}: a cell raised an error:\n{exc}{hint}", pytrace=False)
    except nbclient.exceptions.CellTimeoutError as exc:
        pytest.fail(f"{path.name}: a cell ran past {CELL_TIMEOUT_S} s:\n{exc}", pytrace=False)
    except nbclient.exceptions.DeadKernelError as exc:
        pytest.fail(f"{path.name}: the kernel died: {exc}", pytrace=False)
    except Exception as exc:  # no kernelspec, the kernel does not start, ...
        pytest.fail(f"{path.name}: could not run the Jupyter kernel {KERNEL!r} "
                    f"({type(exc).__name__}: {exc}); install the test extra in this "
                    "environment: pip install -e '.[test]' (it brings ipykernel)",
                    pytrace=False)
    return nb


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path) -> None:
    start = time.perf_counter()
    nb = _execute(path)
    elapsed = time.perf_counter() - start
    errors = [(i, out.get("ename"), out.get("evalue"))
              for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
              for out in cell.outputs if out.output_type == "error"]
    assert not errors, f"{path.name}: cells with errors: {errors}"
    images = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
              for out in cell.outputs if "image/png" in out.get("data", {})]
    assert images, f"{path.name}: no cell produced a PNG figure"
    ran = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(cell.get("execution_count") for cell in ran), f"{path.name}: a cell did not run"
    print(f"{path.name}: {len(ran)} code cells, {len(images)} figures in {elapsed:.1f} s")
    _check_tour_picture(path, nb)


# A committed tour picture may differ from a fresh render in this many of its pixels (text
# antialiasing between builds); a moved bar or point changes more (a stale picture of
# notebooks 02 and 04 differed in 2-6% of them).
TOUR_PIXELS_DIFFERING = 0.01


def _check_tour_picture(path: Path, nb: Any) -> None:
    """The README's tour picture of this notebook (docs/tour/<name>.png) is what the notebook
    draws today, so the README never shows old numbers."""
    import base64
    import io

    import matplotlib.image
    import numpy as np

    committed = NOTEBOOKS_DIR.parent / "docs" / "tour" / f"{path.stem}.png"
    tagged = [cell for cell in nb.cells if cell.cell_type == "code"
              and "tour" in cell.get("metadata", {}).get("tags", [])]
    if not tagged:
        return
    fresh = next((out["data"]["image/png"] for out in tagged[0].outputs
                  if "image/png" in out.get("data", {})), None)
    assert fresh is not None, f"{path.name}: the cell tagged 'tour' drew no figure"
    new = matplotlib.image.imread(io.BytesIO(base64.b64decode(fresh)), format="png")
    old = matplotlib.image.imread(committed)
    stale = (f"{path.name}: docs/tour/{committed.name} is not what the notebook draws today; "
             f"re-render it: python notebooks/render_tour.py {path.name}")
    assert new.shape == old.shape, stale
    differing = float(np.abs(new - old).max(axis=-1).astype(bool).mean())
    assert differing <= TOUR_PIXELS_DIFFERING, f"{stale} ({differing:.1%} of pixels differ)"
