"""The ``gpusim`` command: a thin layer over the Python API, one module per command
(estimate and memory, profiles, models, measure/calibrate/validate, sweep, search, compare,
scaling, kernel), the flags they share in ``flags``."""

from gpusim.cli.app import main

__all__ = ["main"]
