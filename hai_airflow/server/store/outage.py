"""The store unavailable for a while (a database restart, a network cut, a locked file): what that
looks like, and one log line for it instead of a traceback a cycle."""

from __future__ import annotations

import logging
import time

from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

STORE_UNAVAILABLE: tuple[type[Exception], ...] = (
    OperationalError,
    InterfaceError,
    DisconnectionError,
    PoolTimeout,
)
"""What the store raises while it cannot be reached or used for a moment: the API answers 503 with
Retry-After, the controller waits."""
REPEAT_SECONDS = 30.0
"""How often a continuing outage is logged again."""


def first_line(error: BaseException) -> str:
    return str(error).splitlines()[0][:300] if str(error) else type(error).__name__


class Outage:
    """Tells the log when the store went away (and every REPEAT_SECONDS while it stays away) and when it
    came back, with how long it was gone."""

    def __init__(self, log: logging.Logger, who: str) -> None:
        self.log = log
        self.who = who
        self.since: float | None = None
        self.said_at = 0.0
        self.last_failed = 0.0

    def failed(self, error: BaseException, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self.since is None or now - self.last_failed > 2 * REPEAT_SECONDS:
            # A new outage (whoever reports it may never see the end of the last one: the API)
            self.since, self.said_at = now, 0.0
        self.last_failed = now
        if now - self.said_at >= REPEAT_SECONDS:
            self.said_at = now
            gone = f" for {now - self.since:.0f} s" if now > self.since else ""
            self.log.warning(
                "the store is unavailable%s (%s); the %s waits for it", gone, first_line(error), self.who
            )

    def recovered(self, now: float | None = None) -> None:
        if self.since is None:
            return
        now = time.monotonic() if now is None else now
        self.log.warning("the store is back after %.1f s; the %s goes on", now - self.since, self.who)
        self.since, self.said_at = None, 0.0
