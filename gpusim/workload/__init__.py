"""Workloads: layers, the ops they launch, models and the zoo."""
