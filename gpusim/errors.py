"""The errors gpusim raises on purpose.

A ``GpusimError`` is an answer about the user's input or job (an unknown GPU, a job that does
not fit), never a bug, but for ``SimulationStalled``, which reports one in a line. The CLI
prints its message on one line and exits with status 2; sweeps record it per point and go on.
"""

from __future__ import annotations

from collections.abc import Callable


class GpusimError(Exception):
    """Base of every domain error; the message is written for a person."""

    @property
    def summary(self) -> str:
        """The message without advice that takes work to find (see OutOfMemory)."""
        return str(self)


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
    """The job does not fit in device memory; the message carries the breakdown and, once
    read, what to try (``advice``: each remedy is planned again, so it is worked out only
    when someone reads it, not when a search skips the job)."""

    def __init__(self, message: str, *, required_bytes: float, available_bytes: float,
                 peak_bytes: float, advise: Callable[[bool], str] | None = None) -> None:
        super().__init__(message)
        self.required_bytes = required_bytes  # peak, what the allocator strands, the context
        self.available_bytes = available_bytes
        self.peak_bytes = peak_bytes  # allocated peak, as a job that fits reports it
        self._advise = advise
        self._advice: dict[bool, str] = {}

    @property
    def summary(self) -> str:
        """The breakdown without the advice."""
        return str(self.args[0]) if self.args else ""

    def advice(self, cli: bool = False) -> str:
        """What to try, naming command-line flags (``cli``) or ``gpusim.estimate``'s
        arguments."""
        if self._advise is None:
            return ""
        if cli not in self._advice:
            self._advice[cli] = self._advise(cli)
        return self._advice[cli]

    def message(self, cli: bool = False) -> str:
        advice = self.advice(cli)
        return f"{self.summary}; {advice}" if advice else self.summary

    def __str__(self) -> str:
        return self.message(cli=False)


class SimulationStalled(GpusimError):
    """The simulated step stopped short: every rank left waits for another (a defect of
    the simulator, not of the job)."""


class InvalidMeasurement(GpusimError):
    """A measurement file is missing, malformed, or of the wrong suite for the task."""


class MissingDependency(GpusimError):
    """An optional package (torch, for measuring) is not installed."""
