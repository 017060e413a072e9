"""The exec bulkhead: `hai exec` work on threads of its own, within each user's budget of commands."""

# An exec's blocking work never runs on the pool that serves the other requests and the controller
# (anyio's default, 40 threads): one user's execs filled it and froze the API for everyone. A local
# exec's pipe is read by the event loop itself, with no thread; a backend's blocking stream (docker,
# kubernetes) is read on READERS, one thread per stream while it waits; the short calls (start, is the
# worker alive, kill, exit code) run on CONTROL. A user may have `[limits] execs_per_user` execs at
# once on this server; the next is refused with 429, and other users are untouched.

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from hai_airflow.backends.common.execs import READ_BYTES, ExecRun
from hai_airflow.server.api.budgets import Claim

logger = logging.getLogger(__name__)
T = TypeVar("T")

READER_THREADS = 64
"""Blocking exec streams (docker, kubernetes) read at once on this server; more wait for a thread."""
CONTROL_THREADS = 16
"""Exec starts, liveness checks, kills and exit codes under way at once."""
READERS = ThreadPoolExecutor(READER_THREADS, thread_name_prefix="hai-exec-read")
CONTROL = ThreadPoolExecutor(CONTROL_THREADS, thread_name_prefix="hai-exec")


async def on_control(fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)` on the exec control threads."""
    return await asyncio.wrap_future(CONTROL.submit(fn, *args))


async def start(fn: Callable[..., ExecRun], *args: object) -> ExecRun:
    """Start an exec with `fn(*args)` on the control threads; one whose caller is gone meanwhile is
    killed once it has started."""
    future = CONTROL.submit(fn, *args)
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        future.add_done_callback(_end_abandoned)
        raise


def _end_abandoned(future: Future[ExecRun]) -> None:
    if not future.cancelled() and future.exception() is None:
        run = future.result()
        run.kill()
        run.close()


class ExecSession:
    """One started exec as the server streams it: its output read apart from the request threads, and
    its end, once, from any thread, without blocking: the command killed, what it holds released, and
    then its user's slot."""

    def __init__(self, run: ExecRun, slot: Claim) -> None:
        self.run, self.slot = run, slot
        self.ended = threading.Event()
        self._lock = threading.Lock()
        self._reading: Future[bytes | None] | None = None

    def output(self) -> AsyncIterator[bytes]:
        """The command's output as it comes."""
        return _pipe_chunks(self.run.pipe) if self.run.pipe is not None else self._read_on_threads()

    async def _read_on_threads(self) -> AsyncIterator[bytes]:
        while True:
            self._reading = READERS.submit(next, self.run.output, None)
            chunk = await asyncio.wrap_future(self._reading)
            if chunk is None:
                return
            yield chunk

    def end(self) -> None:
        with self._lock:
            if self.ended.is_set():
                return
            self.ended.set()
        try:
            CONTROL.submit(self._finish)
        except RuntimeError:  # the interpreter is exiting (a finalizer): no new threads, end it here
            self._finish()

    def _finish(self) -> None:
        try:
            self.run.kill()
            self.run.close()
        except Exception as e:
            logger.warning("ending an exec failed: %r", e)
        finally:
            # A stream still read on a reader thread holds that thread: the slot is free once it is.
            reading = self._reading
            if reading is None:
                self.slot.release()
            else:
                reading.add_done_callback(lambda _: self.slot.release())


async def _pipe_chunks(fd: int) -> AsyncIterator[bytes]:
    """What comes through a non-blocking pipe, read by the event loop when it is readable."""
    while True:
        try:
            chunk = os.read(fd, READ_BYTES)
        except BlockingIOError:
            await _readable(fd)
            continue
        if not chunk:
            return
        yield chunk


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def woken() -> None:
        if not ready.done():  # a level-triggered wake may come twice before the reader is removed
            ready.set_result(None)

    loop.add_reader(fd, woken)
    try:
        await ready
    finally:
        loop.remove_reader(fd)
