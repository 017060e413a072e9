"""`--watch`: redraw a view whenever one of the tasks it shows changes state, by long-poll, not by polling."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from types import FrameType
from typing import NoReturn

import typer

from hai_airflow.cli.connection import ServerFlags, async_client_for, connect
from hai_airflow.cli.output import stdout_is_terminal
from hai_airflow.client import HaiClient, HaiError

REFRESH_SECONDS = 10.0
"""The longest a view goes unredrawn (should a long-poll miss a change, or the server not have the
task list's long-poll)."""

WATCHED_AT_MOST = 50
"""Long-polls held at once; a longer listing is redrawn on a change of its first tasks or on refresh."""

CLEAR = "\x1b[H\x1b[2J"

Draw = Callable[[HaiClient], Mapping[int, str] | None]
"""Prints the view once and returns the tasks to watch (id -> state), or None when nothing can change."""


async def _any_change(
    connection: ServerFlags, watched: Mapping[int, str], revision: str | None, timeout: float
) -> None:
    """Return when any watched task leaves its state, the task list moves on from `revision` (a task
    submitted, one changed), or after `timeout` seconds.

    A poll the server refuses (the task vanished from view) is no change; only the refresh redraws then.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with async_client_for(connection, timeout=timeout + 15) as client:
        pending: set[asyncio.Future[object]] = {
            asyncio.ensure_future(client.wait(job_id, since_state=state, timeout=timeout))
            for job_id, state in list(watched.items())[:WATCHED_AT_MOST]
        }
        if revision is not None:
            pending.add(asyncio.ensure_future(client.jobs_revision(after=revision, timeout=timeout)))
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(poll.exception() is None for poll in done):
                    return
            await asyncio.sleep(max(deadline - loop.time(), 0))
        finally:
            for poll in pending:
                poll.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


def _interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt


@contextlib.contextmanager
def ctrl_c_raises() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt at once, inside the event loop too.

    Left at Python's default handler, `asyncio.Runner` turns Ctrl-C into a cancellation of the wait in
    progress; one that lands while the HTTP client closes a connection inside a shielded scope is
    absorbed there, the wait returns as if a task had changed, and the watch goes on. Any other
    handler makes the runner leave Ctrl-C alone.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only: Ctrl-C stays as it is
        return
    previous = signal.signal(signal.SIGINT, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _revision(client: HaiClient) -> str | None:
    """The task list's revision before a draw; None from a server without the long-poll."""
    try:
        return client.jobs_revision()
    except HaiError:
        return None


def watch(connection: ServerFlags, command: str, draw: Draw) -> NoReturn:
    """Draw the view, then redraw it on every change until Ctrl-C (or until nothing can change)."""
    terminal = stdout_is_terminal()
    try:
        # One runner for every wait; the loop is closed on the way out (its waits cancelled), so
        # Ctrl-C leaves no half-run coroutine or unclosed loop behind.
        with ctrl_c_raises(), connect(connection) as client, asyncio.Runner() as runner:
            while True:
                if terminal:
                    sys.stdout.write(CLEAR)
                    typer.echo(f"{command} (watching; Ctrl-C to stop)  {datetime.now():%H:%M:%S}\n")
                revision = _revision(client)
                watched = draw(client)
                if not terminal:
                    typer.echo("")
                sys.stdout.flush()
                if watched is None:
                    raise typer.Exit(0)
                with contextlib.suppress(Exception):
                    runner.run(_any_change(connection, watched, revision, REFRESH_SECONDS))
    except (KeyboardInterrupt, asyncio.CancelledError):
        # Ctrl-C (the CancelledError too, should the runner's own handling ever be in place): stopped
        # by the user.
        raise typer.Exit(130) from None
