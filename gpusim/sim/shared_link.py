"""A link that concurrent transfers share: each of k transfers crossing it moves at 1/k of
its own rate (processor sharing), so two that overlap both finish later than either would
alone, and the pair takes as long as running them back to back."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

_DONE = 1e-12  # seconds of work left that count as finished (floating-point slack)


class SharedLink:
    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.active = 0
        self._changed = env.event()

    def _change(self, delta: int) -> None:
        self.active += delta
        changed, self._changed = self._changed, self.env.event()
        changed.succeed()

    def transfer(self, seconds: float) -> Generator[simpy.Event, Any, None]:
        """Occupy the link for a transfer that alone would take ``seconds``."""
        self._change(+1)
        remaining = seconds
        try:
            while remaining > _DONE:
                share = 1.0 / self.active
                start = self.env.now
                finish = self.env.timeout(remaining / share)
                fired = yield finish | self._changed
                if finish in fired:
                    # Its own time ran out: done, whatever is left after rounding (late in a
                    # long simulation one tick of the clock exceeds any fixed slack).
                    break
                remaining -= (self.env.now - start) * share
        finally:
            self._change(-1)
