"""Exploring what-if questions over many estimates: sweeps (``gpusim.explore.sweep``).

The package re-exports nothing, so ``gpusim.explore.sweep`` stays the module (a function of
the same name here would hide it).
"""
