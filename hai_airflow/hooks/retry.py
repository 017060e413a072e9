"""Retrying calls to the hai server that fail for a moment, with growing, jittered delays."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from hai_airflow.client import HaiError, HaiUnreachable

T = TypeVar("T")


def is_transient(error: HaiError) -> bool:
    """Worth retrying: no server answered, or it answered that it is briefly unable to."""
    return isinstance(error, HaiUnreachable) or error.status >= 500 or error.status in (408, 429)


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


def _give_up(error: HaiError, attempt: int, attempts: int | None) -> bool:
    return not is_transient(error) or (attempts is not None and attempt >= attempts)


def retry_transient(
    call: Callable[[], T],
    *,
    what: str,
    log: Any,
    max_backoff: float = 30.0,
    attempts: int | None = None,
    sleep: Callable[[float], object] = time.sleep,
    backoff: Backoff | None = None,
) -> T:
    """`call()`, tried again after a jittered delay while it fails transiently.

    A non-transient :class:`HaiError` is raised at once; a transient one after `attempts`
    tries (None: never give up).

    :param what: what the call does, for the log line (``"following hai job 3"``).
    """
    backoff = backoff or Backoff(max_backoff)
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except HaiError as e:
            if _give_up(e, attempt, attempts):
                raise
            delay = backoff.next_delay()
            log.warning("hai server not answering while %s (%s); retrying in %.1f s", what, e.message, delay)
            sleep(delay)


async def aretry_transient(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    log: Any,
    max_backoff: float = 30.0,
    attempts: int | None = None,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    backoff: Backoff | None = None,
) -> T:
    """The asyncio twin of :func:`retry_transient`, for triggers."""
    backoff = backoff or Backoff(max_backoff)
    attempt = 0
    while True:
        attempt += 1
        try:
            return await call()
        except HaiError as e:
            if _give_up(e, attempt, attempts):
                raise
            delay = backoff.next_delay()
            log.warning("hai server not answering while %s (%s); retrying in %.1f s", what, e.message, delay)
            await sleep(delay)
