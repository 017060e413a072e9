"""Retrying calls to the hai server that fail for a moment, with growing, jittered delays."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from hai_airflow.backoff import Backoff
from hai_airflow.client import HaiError, HaiUnreachable

__all__ = ["Backoff", "aretry_transient", "is_transient", "retry_transient"]

T = TypeVar("T")


def is_transient(error: HaiError) -> bool:
    """Worth retrying: no server answered, or it answered that it is briefly unable to."""
    return isinstance(error, HaiUnreachable) or error.status >= 500 or error.status in (408, 429)


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
