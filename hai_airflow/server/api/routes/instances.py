"""Instance routes: one run of a job, and its log (a tail, or followed until the run ends)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import iterate_in_threadpool, run_in_threadpool
from fastapi.responses import PlainTextResponse, StreamingResponse

from hai_airflow.backends.common import log_files
from hai_airflow.backends.common.base import Handle
from hai_airflow.backends.common.live_logs import FanIn, LiveLogs, WorkerLog, read_workers
from hai_airflow.backends.common.safefs import UnsafeFile
from hai_airflow.server.api.routes.depends import DB_RECHECK_SECONDS, CallerDep, CtxDep, visible_instance
from hai_airflow.server.api.routes.served import served_backend
from hai_airflow.server.errors import ApiError, ServerStopping
from hai_airflow.server.jobs.views import instance_view
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.store.tables import InstanceRow
from hai_airflow.spec import STORE_INT_MAX, InstanceView, StoreId

logger = logging.getLogger(__name__)
router = APIRouter()
LOG_POLL_SECONDS = 0.2
TEXT = "text/plain; charset=utf-8"
FILE_ONLY_BACKENDS = frozenset({"local"})
"""Backends whose jobs write the instance's log file as they run: the file is the live log."""


@router.get("/instances/{instance_id}")
def get_instance(instance_id: StoreId, ctx: CtxDep, caller: CallerDep) -> InstanceView:
    with ctx.store.read() as s:
        return instance_view(visible_instance(s, caller, instance_id))


@router.get("/instances/{instance_id}/log", response_class=PlainTextResponse)
def instance_log(
    instance_id: StoreId,
    ctx: CtxDep,
    caller: CallerDep,
    request: Request,
    tail: Annotated[int, Query(ge=0, le=STORE_INT_MAX)] = 0,
    follow: bool = False,
) -> Response:
    """While the instance runs, its workers' logs as the backend serves them; after, the kept log file."""
    with ctx.store.read() as s:
        inst = visible_instance(s, caller, instance_id)
        path = Path(inst.log_path) if inst.log_path else None
        running = Handle(inst.id, json.loads(inst.handle)) if inst.handle and inst.ended_at is None else None
    if path is None:
        # Not started yet: no log, and nothing to follow until the next instance.
        return PlainTextResponse("")
    backend = _live_backend(request, ctx) if running is not None else None
    workers = _worker_logs(backend, running) if backend is not None and running is not None else []
    if backend is not None and workers:
        if follow:
            live = _follow_live(ctx, instance_id, workers, tail, backend, path)
            return StreamingResponse(live, media_type=TEXT)
        return PlainTextResponse(read_workers(workers, tail, backend.explain_log_error))
    log = log_files.LogCursor(path, ctx.home)
    try:
        log.ready()
    except UnsafeFile as exc:
        raise _refused(instance_id, exc) from None
    if follow:
        return StreamingResponse(_follow(ctx, instance_id, log, tail), media_type=TEXT)
    if tail > 0:
        with log:
            return PlainTextResponse(log.tail(tail) + log.rest())
    # The whole log goes out one block at a time, never held in memory at once.
    return StreamingResponse(log.stream(), media_type=TEXT)


def _live_backend(request: Request, ctx: ServerContext) -> LiveLogs | None:
    """The backend that serves running instances' logs (`served_backend`); None when the instance's
    log file is its live log (local) or the backend cannot be reached now."""
    if ctx.config.server.backend in FILE_ONLY_BACKENDS:
        return None
    backend = served_backend(request, ctx)
    return backend if isinstance(backend, LiveLogs) else None


def _worker_logs(backend: LiveLogs, handle: Handle) -> list[WorkerLog]:
    """The running instance's workers' logs; [] (read the file) when the backend cannot name them now."""
    try:
        return backend.worker_logs(handle)
    except Exception as e:
        logger.warning("cannot find the workers of instance %d: %s", handle.instance_id, e)
        return []


async def _follow_live(
    ctx: ServerContext, instance_id: int, workers: list[WorkerLog], tail: int, backend: LiveLogs, path: Path
) -> AsyncIterator[str]:
    """The workers' logs followed from the backend; when one cannot be read, the kept log once it ends."""
    # Made here, not in the route: the streams open only once the answer is being sent.
    fan_in = FanIn(workers, tail, backend.explain_log_error)
    stop = asyncio.ensure_future(_close_on_stop(ctx, fan_in))
    try:
        async for text in iterate_in_threadpool(fan_in):
            yield text
    finally:
        stop.cancel()
        fan_in.close()
    if ctx.stopping.is_set():
        raise ServerStopping(f"the server stopped while instance {instance_id}'s log was followed")
    if fan_in.unreadable:
        async for text in _follow(ctx, instance_id, log_files.LogCursor(path, ctx.home), 0):
            yield text


async def _close_on_stop(ctx: ServerContext, fan_in: FanIn) -> None:
    """End the fan-in when the server stops (it waits for the workers' next lines in threads)."""
    while not ctx.stopping.is_set():
        await asyncio.sleep(LOG_POLL_SECONDS)
    fan_in.close()


def _refused(instance_id: int, exc: UnsafeFile) -> ApiError:
    """The answer for a log the server will not open: the job put a link or a special file in its place."""
    return ApiError(
        409,
        f"the log of instance {instance_id} is not shown: {exc.strerror}",
        field="instance_id",
        fix="The job replaced its log file; the server reads only the regular file it created. "
        "Let the job write to stdout/stderr and leave output.log alone.",
    )


async def _follow(
    ctx: ServerContext, instance_id: int, log: log_files.LogCursor, tail: int
) -> AsyncIterator[str]:
    """The tail, then whatever is appended, until the instance has ended and the file is drained."""

    def ended() -> bool:
        with ctx.store.read() as s:
            inst = s.get(InstanceRow, instance_id)
            return inst is None or inst.ended_at is not None

    try:
        if tail > 0:
            text = await run_in_threadpool(log.tail, tail)
            if text:
                yield text
        last_check, finished = 0.0, False
        while True:
            if ctx.stopping.is_set():
                raise ServerStopping(f"the server stopped while instance {instance_id}'s log was followed")
            if time.monotonic() - last_check >= DB_RECHECK_SECONDS:
                finished = await run_in_threadpool(ended)
                last_check = time.monotonic()
            text, done = await run_in_threadpool(log.step, finished)
            if text:
                yield text
            if done:
                return
            if not text:
                await asyncio.sleep(LOG_POLL_SECONDS)
    finally:
        log.close()
