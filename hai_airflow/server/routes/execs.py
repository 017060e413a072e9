"""`POST /jobs/{id}/exec`: a command run in a running task's worker, its output streamed back."""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.concurrency import iterate_in_threadpool, run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from hai_airflow.backends.base import Handle
from hai_airflow.backends.execs import Exec, ExecRefused, ExecRun
from hai_airflow.endpoints import NDJSON
from hai_airflow.server.auth import Caller
from hai_airflow.server.boundary import strict_body
from hai_airflow.server.context import ServerContext
from hai_airflow.server.errors import ApiError
from hai_airflow.server.routes.deps import CallerDep, CtxDep, add_event, current_instance, visible_job
from hai_airflow.server.routes.served import served_backend
from hai_airflow.server.tables import JobRow
from hai_airflow.spec import ExecArg, JobState, StoreId, StoreNumber

router = APIRouter()
logger = logging.getLogger(__name__)

MAX_EXEC_ARGS = 4096
MAX_EXEC_SECONDS = 7 * 24 * 3600
WATCH_SECONDS = 0.5
"""How often a running exec looks whether its worker is gone, its time is up or the server stops."""
SHOWN_COMMAND_CHARS = 200


class ExecRequest(BaseModel):
    """Body of `POST /jobs/{id}/exec`."""

    model_config = ConfigDict(extra="forbid")
    command: list[ExecArg] = Field(
        min_length=1, max_length=MAX_EXEC_ARGS, description="The program and its arguments (no shell)."
    )
    worker: StoreNumber = Field(default=0, description="The worker (rank) to run it beside.")
    timeout_seconds: int | None = Field(
        default=None, ge=1, le=MAX_EXEC_SECONDS, description="Kill it after this long; none: until it ends."
    )


@router.post(
    "/jobs/{job_id}/exec",
    response_class=StreamingResponse,
    responses={200: {"content": {NDJSON: {}}, "description": '{"output": text} lines, then {"exit_code"}'}},
)
async def exec_in_job(
    job_id: StoreId,
    body: Annotated[ExecRequest, strict_body(ExecRequest)],
    ctx: CtxDep,
    caller: CallerDep,
    request: Request,
) -> StreamingResponse:
    """Run a command beside a running task's worker, as the task's account, with its environment and
    in its directory: only the task's owner may. The answer streams `{"output": text}` lines, then one
    `{"exit_code": N, "reason": ...}` (reason: why it was ended early, or null)."""
    handle, owner = await run_in_threadpool(_running_handle, ctx, caller, job_id, body)
    backend = served_backend(request, ctx)
    if not isinstance(backend, Exec):
        raise ApiError(
            409,
            f"the {ctx.config.server.backend} backend cannot run commands in tasks now",
            fix="Read the task's log with `hai log`, or ask the platform admin",
        )
    try:
        run = await run_in_threadpool(backend.exec_in, handle, body.worker, body.command, owner)
    except ExecRefused as e:
        raise ApiError(
            409, f"cannot run it in task {job_id}: {e}", field="worker", fix=_RUNNING_FIX
        ) from None
    except (KeyError, OSError) as e:
        raise ApiError(409, f"cannot run it in task {job_id}: {e}", fix="Ask the platform admin") from None
    return StreamingResponse(_stream(ctx, run, body.timeout_seconds), media_type=NDJSON)


_RUNNING_FIX = "See where the task runs with `hai task N`; commands run only in a running task's workers"


def _running_handle(ctx: ServerContext, caller: Caller, job_id: int, body: ExecRequest) -> tuple[Handle, str]:
    """The running instance's handle, once the caller is found to own the task; the exec is recorded."""
    with ctx.store.write() as s:
        row = visible_job(s, caller, job_id)
        if row.user_name != caller.name:
            raise ApiError(
                403,
                f"only {row.user_name} may run commands in task {job_id}",
                field="job_id",
                fix="Commands run as the task's own account: ask its owner",
            )
        inst = current_instance(s, row)
        if row.state != JobState.RUNNING or inst is None or not inst.handle or inst.ended_at is not None:
            raise ApiError(
                409, f"task {job_id} is not running ({row.state})", field="job_id", fix=_RUNNING_FIX
            )
        if body.worker >= row.workers:
            raise ApiError(
                422,
                f"task {job_id} has {row.workers} worker(s); there is no worker {body.worker}",
                field="worker",
                fix=f"Give a worker from 0 to {row.workers - 1}",
            )
        _record(s, row, body, caller)
        return Handle(inst.id, json.loads(inst.handle)), row.user_name


def _record(s: Session, row: JobRow, body: ExecRequest, caller: Caller) -> None:
    """An event on the task: who ran what (its owner and group admins see it, as they see its command)."""
    shown = " ".join(body.command)
    if len(shown) > SHOWN_COMMAND_CHARS:
        shown = shown[: SHOWN_COMMAND_CHARS - 3] + "..."
    add_event(s, row, "exec", f"{caller.name} ran `{shown}` in worker {body.worker}", caller)


def _line(**fields: object) -> bytes:
    return json.dumps(fields, ensure_ascii=False).encode() + b"\n"


async def _stream(ctx: ServerContext, run: ExecRun, timeout: int | None) -> AsyncIterator[bytes]:
    """The command's output as `{"output"}` lines, then how it ended; it is killed if the caller hangs
    up, its time is up, its worker ends or the server stops."""
    ended = threading.Event()
    why: list[str] = []
    watch = asyncio.ensure_future(_watch(ctx, run, timeout, ended, why))
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    code: int | None = None
    try:
        async for chunk in iterate_in_threadpool(run.output):
            if text := decoder.decode(chunk):
                yield _line(output=text)
        if text := decoder.decode(b"", final=True):
            yield _line(output=text)
        code = await run_in_threadpool(run.exit_code)
    except Exception as e:
        # The backend's stream broke (an engine or API server gone): the caller still gets an end.
        logger.warning("an exec's stream broke: %r", e)
        why.append(f"the backend's stream of its output broke ({type(e).__name__})")
    finally:
        ended.set()
        watch.cancel()
        run.kill()
    yield _line(exit_code=code, reason=why[0] if why else None)


async def _watch(
    ctx: ServerContext, run: ExecRun, timeout: int | None, ended: threading.Event, why: list[str]
) -> None:
    deadline = None if timeout is None else time.monotonic() + timeout
    while not ended.is_set():
        await asyncio.sleep(WATCH_SECONDS)
        if deadline is not None and time.monotonic() >= deadline:
            why.append(f"killed after its timeout of {timeout} s")
        elif ctx.stopping.is_set():
            why.append("killed: the server is stopping")
        elif not await run_in_threadpool(run.alive):
            why.append("killed: the task's worker ended")
        else:
            continue
        run.kill()
        return
