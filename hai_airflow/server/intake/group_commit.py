"""Group commit: requests hand their work to the intake's threads, which do all that waits in one go.

An `async` route awaits `Intake.put` on the event loop, so no request holds a pool thread while it
waits for the database. An intake thread takes whatever has queued up since it last looked (up
to `BATCH_LIMIT`) and passes it to `handle` at once: the API's submits share one transaction and
one commit. `handle` gives one outcome per item, a value or the exception that item's request
raises, so one refusal never fails the others. With more than one thread, a batch is checked while
another waits for the database, so `handle` must be safe to run in several threads at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger("hai.server.intake")

Item = TypeVar("Item")
Result = TypeVar("Result")

BATCH_LIMIT = 64
"""Items handled together at most: bounds a batch's transaction, and the wait of its last item."""
IDLE_SECONDS = 30.0
"""The thread ends after this long with nothing to do; the next `put` starts another."""


@dataclass(frozen=True)
class _Waiting(Generic[Item]):
    item: Item
    loop: asyncio.AbstractEventLoop
    answer: asyncio.Future[object]


def _settle(answer: asyncio.Future[object], outcome: object) -> None:
    if answer.done():  # the request went away meanwhile
        return
    if isinstance(outcome, BaseException):
        answer.set_exception(outcome)
    else:
        answer.set_result(outcome)


class Intake(Generic[Item, Result]):
    """Items from any event loop, handled in batches by up to `workers` threads of its own, which run
    while there is work (so an app that is never shut down leaves no thread behind).

    :param handle: the items of one batch to their outcomes, in order; an outcome that is an
        exception is raised to that item's caller.
    """

    def __init__(
        self, handle: Callable[[list[Item]], list[Result | BaseException]], name: str, workers: int = 1
    ):
        self.handle = handle
        self.name = name
        self.workers = workers
        self._queue: queue.SimpleQueue[_Waiting[Item] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()

    async def put(self, item: Item) -> Result:
        """Queue `item` and wait for its outcome."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[object] = loop.create_future()
        self._queue.put(_Waiting(item, loop, answer))
        self._ensure_threads()
        return await answer  # type: ignore[return-value]

    def _ensure_threads(self) -> None:
        with self._lock:
            self._threads = {t for t in self._threads if t.is_alive()}
            while len(self._threads) < self.workers:
                thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._threads.add(thread)
                thread.start()

    def stop(self) -> None:
        """Handle what is queued, then end the threads (a later `put` starts them again)."""
        with self._lock:
            threads, self._threads = self._threads, set()
            for _ in threads:
                self._queue.put(None)  # one each: a thread ends on the first it takes
        for thread in threads:
            thread.join()

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    # Under the lock a `put` either queued already (seen here) or starts a new thread.
                    if self._queue.empty():
                        self._threads.discard(threading.current_thread())
                        return
                continue
            if first is None:
                return
            batch = [first]
            while len(batch) < BATCH_LIMIT:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:  # stop after this batch
                    self._queue.put(None)
                    break
                batch.append(more)
            self._answer(batch)

    def _answer(self, batch: list[_Waiting[Item]]) -> None:
        try:
            outcomes: list[Result | BaseException] = self.handle([w.item for w in batch])
        except BaseException as e:
            log.exception("%s: a batch of %d failed", self.name, len(batch))
            outcomes = [e] * len(batch)
        for waiting, outcome in zip(batch, outcomes, strict=True):
            # A closed loop raises RuntimeError: its request is gone with it.
            with contextlib.suppress(RuntimeError):
                waiting.loop.call_soon_threadsafe(_settle, waiting.answer, outcome)
