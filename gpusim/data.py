"""Where gpusim's shipped data lives: hardware profiles, stacks, measurements and published
figures are folders at the top of the repository, copied into the package (``gpusim/_data``)
when a wheel is built (setup.py lists them), so an installed gpusim finds them without the checkout.
"""

from __future__ import annotations

import os
from pathlib import Path


def data_dir(name: str) -> Path:
    """The folder ``name``: ``GPUSIM_<NAME>_DIR`` if set, the wheel's copy when installed,
    else the repository's (a checkout or an editable install)."""
    override = os.environ.get(f"GPUSIM_{name.upper()}_DIR")
    if override:
        return Path(override)
    packaged = Path(__file__).resolve().parent / "_data" / name
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[1] / name
