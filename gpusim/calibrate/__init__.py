"""Calibration: fitting a device's efficiencies to its measured micro suite."""
