"""Growing, jittered delays between attempts of a call that fails for a moment."""

from __future__ import annotations

import random


class Backoff:
    """Delays between attempts: a random time between half and all of 1 s, 2 s, 4 s ... `maximum`.

    Random, so that hundreds of deferred tasks that lost the server together (a restart) do not
    all come back in the same second; never below half, so a dead server is not hammered.

    :param maximum: the longest delay in seconds.
    :param first: the first delay's ceiling in seconds.
    :param rng: the source of jitter (a seeded one in tests).
    """

    def __init__(self, maximum: float = 30.0, first: float = 1.0, rng: random.Random | None = None) -> None:
        self.maximum = maximum
        self.first = first
        self.rng = rng or random.Random()
        self._ceiling = first

    def next_delay(self) -> float:
        ceiling = min(self._ceiling, self.maximum)
        self._ceiling = min(self._ceiling * 2, self.maximum)
        return self.rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self._ceiling = self.first
