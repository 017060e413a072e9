"""In-process wake-ups: the API wakes the controller, the controller wakes long-polls."""

from __future__ import annotations

import asyncio
import contextlib
import threading


class Wakeup:
    """Wakes the controller loop early (a submit, a cancel, an exit) instead of its next tick."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def wait(self, timeout: float) -> bool:
        woken = self._event.wait(timeout)
        self._event.clear()
        return woken


class Broadcast:
    """Tells every waiting long-poll (on any event loop) that job states changed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def notify(self) -> None:
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            # A closed loop raises RuntimeError: its waiter is gone with it.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    async def wait(self, timeout: float) -> bool:
        """Wait until the next `notify()` or `timeout` seconds; True if notified."""
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.add(entry)
        try:
            await asyncio.wait_for(entry[1].wait(), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            with self._lock:
                self._waiters.discard(entry)
