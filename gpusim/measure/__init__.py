"""Measuring real runs with PyTorch: the micro suite (for calibration) and the models suite
(for validation). Needs torch; runs on CUDA when a GPU is present, else on the CPU.

The runner builds its PyTorch modules from gpusim's own workload description
(``torch_model``), so what is measured is what is predicted.
"""
