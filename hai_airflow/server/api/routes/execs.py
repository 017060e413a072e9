"""`POST /jobs/{id}/exec`: a command run in a running task's worker, its output streamed back."""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
import signal
import time
import weakref
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from hai_airflow.backends.common.base import Handle
from hai_airflow.backends.common.execs import Exec, ExecRefused, ExecRun
from hai_airflow.endpoints import NDJSON
from hai_airflow.server.api.budgets import budget_of
from hai_airflow.server.api.exec_bulkhead import ExecSession, on_control, start
from hai_airflow.server.api.request_body import strict_body
from hai_airflow.server.api.routes.depends import CallerDep, CtxDep, add_event, current_instance, visible_job
from hai_airflow.server.api.routes.served import served_backend
from hai_airflow.server.errors import ApiError
from hai_airflow.server.jobs.auth import Caller
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.store.tables import JobRow
from hai_airflow.spec import ExecArg, JobState, StoreId, StoreNumber

router = APIRouter()
logger = logging.getLogger(__name__)

MAX_EXEC_ARGS = 4096
MAX_EXEC_SECONDS = 7 * 24 * 3600
WATCH_SECONDS = 0.5
"""How often a running exec looks whether its worker is gone, its time is up or the server stops."""
SHOWN_COMMAND_CHARS = 200
KILLED = 128 + signal.SIGKILL
"""The exit code of a command killed (SIGKILL)."""
WORKER_ENDED = "killed: the task's worker ended"


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
    in its directory: only the task's owner may, with at most `[limits] execs_per_user` running at once
    (429 past it). The answer streams `{"output": text}` lines, then one `{"exit_code": N, "reason":
    ...}` (reason: why it was ended early, or null)."""
    slot = budget_of(request, "execs_per_user", "commands of `hai exec` running").claim(
        caller.name,
        ctx.config.limits.execs_per_user,
        "Wait for one to end, or end one (Ctrl-C, or give --timeout)",
    )
    try:
        run = await _started(ctx, caller, job_id, body, request)
    except BaseException:
        slot.release()
        raise
    session = ExecSession(run, slot)
    stream = _stream(ctx, session, body.timeout_seconds)
    # A stream that never starts (the caller gone before it did) still ends the command.
    weakref.finalize(stream, session.end)
    return StreamingResponse(stream, media_type=NDJSON)


async def _started(
    ctx: ServerContext, caller: Caller, job_id: int, body: ExecRequest, request: Request
) -> ExecRun:
    """The command started in the task's worker, once the caller is found to own the running task."""
    handle, owner = await run_in_threadpool(_running_handle, ctx, caller, job_id, body)
    backend = served_backend(request, ctx)
    if not isinstance(backend, Exec):
        raise ApiError(
            409,
            f"the {ctx.config.server.backend} backend cannot run commands in tasks now",
            fix="Read the task's log with `hai log`, or ask the platform admin",
        )
    try:
        return await start(backend.exec_in, handle, body.worker, body.command, owner)
    except ExecRefused as e:
        raise ApiError(
            409, f"cannot run it in task {job_id}: {e}", field="worker", fix=_RUNNING_FIX
        ) from None
    except (KeyError, OSError) as e:
        raise ApiError(409, f"cannot run it in task {job_id}: {e}", fix="Ask the platform admin") from None


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


async def _stream(ctx: ServerContext, session: ExecSession, timeout: int | None) -> AsyncIterator[bytes]:
    """The command's output as `{"output"}` lines, then how it ended; it is killed if the caller hangs
    up, its time is up, its worker ends or the server stops."""
    why: list[str] = []
    watch = asyncio.ensure_future(_watch(ctx, session, timeout, why))
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    code: int | None = None
    try:
        async for chunk in session.output():
            if text := decoder.decode(chunk):
                yield _line(output=text)
        if text := decoder.decode(b"", final=True):
            yield _line(output=text)
        code = await on_control(session.run.exit_code)
        if code == KILLED and not why and not await on_control(session.run.alive):
            why.append(WORKER_ENDED)  # ended by the backend with its worker, before the watch saw it
    except Exception as e:
        # The backend's stream broke (an engine or API server gone): the caller still gets an end.
        logger.warning("an exec's stream broke: %r", e)
        why.append(f"the backend's stream of its output broke ({type(e).__name__})")
    finally:
        watch.cancel()
        session.end()
    yield _line(exit_code=code, reason=why[0] if why else None)


async def _watch(ctx: ServerContext, session: ExecSession, timeout: int | None, why: list[str]) -> None:
    """Kill the command at its timeout, when the server stops or when its worker is gone; the kill and
    the look at the worker run on the exec threads."""
    deadline = None if timeout is None else time.monotonic() + timeout
    run = session.run
    while not session.ended.is_set():
        await asyncio.sleep(WATCH_SECONDS)
        if deadline is not None and time.monotonic() >= deadline:
            why.append(f"killed after its timeout of {timeout} s")
        elif ctx.stopping.is_set():
            why.append("killed: the server is stopping")
        elif not await on_control(run.alive):
            why.append(WORKER_ENDED)
        else:
            continue
        await on_control(run.kill)
        return
