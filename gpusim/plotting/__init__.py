"""Plots of gpusim results; the only package that imports matplotlib."""
