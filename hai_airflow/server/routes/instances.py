"""Instance routes: one run of a job, and its log (a tail, or followed until the run ends)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, StreamingResponse

from hai_airflow.backends import logs
from hai_airflow.server.context import ServerContext
from hai_airflow.server.routes.deps import DB_RECHECK_SECONDS, CallerDep, CtxDep, visible_instance
from hai_airflow.server.tables import InstanceRow
from hai_airflow.server.views import instance_view
from hai_airflow.spec import InstanceView

router = APIRouter()
LOG_POLL_SECONDS = 0.2


@router.get("/instances/{instance_id}")
def get_instance(instance_id: int, ctx: CtxDep, caller: CallerDep) -> InstanceView:
    with ctx.store.read() as s:
        return instance_view(visible_instance(s, caller, instance_id))


@router.get("/instances/{instance_id}/log", response_class=PlainTextResponse)
def instance_log(
    instance_id: int,
    ctx: CtxDep,
    caller: CallerDep,
    tail: Annotated[int, Query(ge=0)] = 0,
    follow: bool = False,
) -> Response:
    with ctx.store.read() as s:
        inst = visible_instance(s, caller, instance_id)
        path = Path(inst.log_path)
    if not follow:
        return PlainTextResponse(logs.read_tail(path, tail))
    return StreamingResponse(_follow(ctx, instance_id, path, tail), media_type="text/plain; charset=utf-8")


async def _follow(ctx: ServerContext, instance_id: int, path: Path, tail: int) -> AsyncIterator[str]:
    """The tail, then whatever is appended, until the instance has ended and the file is drained."""

    def ended() -> bool:
        with ctx.store.read() as s:
            inst = s.get(InstanceRow, instance_id)
            return inst is None or inst.ended_at is not None

    offset = 0
    if tail > 0:
        text = logs.read_tail(path, tail)
        if text:
            yield text
        offset = path.stat().st_size if path.exists() else 0
    last_check, finished = 0.0, False
    while True:
        if time.monotonic() - last_check >= DB_RECHECK_SECONDS:
            finished = await run_in_threadpool(ended)
            last_check = time.monotonic()
        data = await run_in_threadpool(_read_from, path, offset)
        offset += len(data)
        if data:
            yield data.decode("utf-8", errors="replace")
        elif finished:
            return
        else:
            await asyncio.sleep(LOG_POLL_SECONDS)


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(1 << 20)
    except FileNotFoundError:
        return b""
