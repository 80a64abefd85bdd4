"""Validation: predictions compared with committed measurements of real runs."""
