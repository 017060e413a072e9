"""The server's clock: wall-clock time that never steps.

Every time the server writes or compares (events, instance starts and ends, grace periods, time
limits, the lease) comes from here. It follows the monotonic clock from the wall clock it started
at, and drifts back towards the wall clock by at most `SLEW` of the time that passes, as ntpd slews:
when an administrator or NTP steps the wall clock by five minutes, a grace period or a time limit
still lasts what it says, a job's events stay in order, and the lease is not taken over because one
server's clock moved. A server taking the lease first moves its clock up to the last controller
write of the one before it (`not_before`), so the times the controllers write never go back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

SLEW = 0.1
"""How fast the clock closes a gap to the wall clock: a step of 5 minutes is taken up in 50."""
STEP = 1.0
"""A gap this large means the wall clock stepped (slewing by NTP never opens one)."""


class Clock:
    def __init__(
        self, wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._wall, self._monotonic = wall, monotonic
        self._lock = threading.Lock()
        self._at, self._mark = wall(), monotonic()
        self._stepped = False

    def now(self) -> float:
        """Seconds since the epoch; never less than the last answer."""
        with self._lock:
            mark = self._monotonic()
            passed = max(mark - self._mark, 0.0)
            at = self._at + passed
            bound = SLEW * passed
            self._at = at + min(max(self._wall() - at, -bound), bound)
            self._mark = mark
            return self._at

    def not_before(self, moment: float) -> None:
        """Move the clock forward to `moment` if it is behind it (never back)."""
        with self._lock:
            self._at = max(self._at, moment)

    def gap(self) -> float:
        """The wall clock minus this clock: what a step of the wall clock left to take up."""
        return self._wall() - self.now()

    def step_seen(self) -> float | None:
        """The gap, the first time it is found over STEP since it was last under it; else None."""
        gap = self.gap()
        stepped, self._stepped = self._stepped, abs(gap) >= STEP
        return gap if self._stepped and not stepped else None


CLOCK = Clock()


def now() -> float:
    """The server's time (`CLOCK.now()`)."""
    return CLOCK.now()
