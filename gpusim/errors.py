"""The errors gpusim raises on purpose.

A ``GpusimError`` is an answer about the user's input or job (an unknown GPU, a job that does
not fit), never a bug. The CLI prints its message on one line and exits with status 2; sweeps
record it per point and go on.
"""

from __future__ import annotations


class GpusimError(Exception):
    """Base of every domain error; the message is written for a person."""


class UnknownName(GpusimError, KeyError):
    """A name (GPU, model, link, system) that no registry knows."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownHardware(UnknownName):
    """No hardware profile has this name or alias."""


class UnknownModel(UnknownName):
    """No zoo model has this name."""


class InvalidProfile(GpusimError):
    """A hardware profile or calibration file breaks the schema."""


class InvalidModel(GpusimError):
    """A model description (zoo entry, YAML file, dimensions) is malformed."""


class InvalidConfig(GpusimError):
    """A job configuration is out of range or contradicts itself."""


class UnsupportedPrecision(InvalidConfig):
    """The device cannot run the requested precision."""


class OutOfMemory(GpusimError):
    """The job does not fit in device memory; the message carries the breakdown and advice."""

    def __init__(self, message: str, *, required_bytes: float, available_bytes: float,
                 peak_bytes: float) -> None:
        super().__init__(message)
        self.required_bytes = required_bytes  # peak plus what the framework reserves
        self.available_bytes = available_bytes
        self.peak_bytes = peak_bytes  # allocated peak, as a job that fits reports it


class InvalidMeasurement(GpusimError):
    """A measurement file is missing, malformed, or of the wrong suite for the task."""


class MissingDependency(GpusimError):
    """An optional package (torch, for measuring) is not installed."""
