"""`GET /jobs/{id}/files[/content]`: a task's model dir listed, and its files downloaded (`hai cp`)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from sqlalchemy import select
from starlette.types import Receive, Scope, Send

from hai_airflow.backends.common.confine import open_beneath
from hai_airflow.backends.common.execs import Exec
from hai_airflow.backends.common.jobuser import JobUser
from hai_airflow.backends.common.safefs import UnsafeFile
from hai_airflow.endpoints import BYTES
from hai_airflow.server.api.budgets import Claim, budget_of
from hai_airflow.server.api.routes.depends import CallerDep, CtxDep, visible_job
from hai_airflow.server.api.routes.served import served_backend
from hai_airflow.server.errors import ApiError
from hai_airflow.server.jobs import modelfiles, paths
from hai_airflow.server.jobs.auth import Caller
from hai_airflow.server.jobs.modelfiles import FileProblem, Opened
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.store.tables import InstanceRow
from hai_airflow.spec import MAX_PATH_CHARS, FilesView, StoreId

router = APIRouter()
log = logging.getLogger(__name__)


FilePath = Annotated[
    str,
    Query(
        max_length=MAX_PATH_CHARS,
        pattern=r"^[^\x00]*$",
        description="A path below the task's model dir ('' for the dir itself), or the whole path.",
    ),
]


@router.get("/jobs/{job_id}/files")
async def list_files(
    job_id: StoreId, ctx: CtxDep, caller: CallerDep, request: Request, path: FilePath = ""
) -> FilesView:
    """What a path below the task's model dir is, and a directory's entries (links are listed, never
    followed). The task's owner and the admins of its group may look, with the rights of the task's
    own account; each look counts against the caller's `[limits] cp_streams_per_user` while it runs."""
    claim = _claim(ctx, caller, request)
    try:
        async with _model_dir(ctx, caller, request, job_id, path) as (where, top):
            return FilesView.model_validate(await modelfiles.listing(top, where.rel, where.account))
    finally:
        claim.release()


@router.get(
    "/jobs/{job_id}/files/content",
    response_class=StreamingResponse,
    responses={200: {"content": {BYTES: {}}, "description": "The file's bytes"}},
)
async def file_content(
    job_id: StoreId, ctx: CtxDep, caller: CallerDep, request: Request, path: FilePath = ""
) -> StreamingResponse:
    """A regular file below the task's model dir, streamed; one larger than `[server]
    max_download_bytes` is refused (413); a caller streaming `[limits] cp_streams_per_user` files
    already is refused (429)."""
    claim = _claim(ctx, caller, request)
    limit = ctx.config.server.max_download_bytes
    try:
        async with _model_dir(ctx, caller, request, job_id, path) as (where, top):
            opened = await modelfiles.open_file(top, where.rel, limit, where.account)
    except BaseException:
        claim.release()
        raise
    headers = {"Content-Length": str(opened.size), "Content-Disposition": disposition(where.rel)}
    return FileStream(opened, claim, job_id, where.rel, headers)


class FileStream(StreamingResponse):
    """A file's bytes as its reader gives them. However the answer ends (sent whole, cut by the
    client, a reader stopped or stalled on the way: the connection is then cut, so the client sees
    a short file), the reader is ended and the caller's cp stream given back."""

    def __init__(self, opened: Opened, claim: Claim, job_id: int, rel: str, headers: dict[str, str]) -> None:
        super().__init__(opened.chunks(), media_type=BYTES, headers=headers)
        self.opened, self.claim, self.job_id, self.rel = opened, claim, job_id, rel

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except FileProblem as problem:
            log.warning("hai cp of %s from task %s cut: %s", self.rel, self.job_id, problem.what)
        finally:
            await self.opened.close()
            self.claim.release()


def disposition(rel: str) -> str:
    """RFC 6266 Content-Disposition for the file's name: the exact name as RFC 5987 `filename*`, and an
    ASCII fallback in which control characters, quotes, backslashes and other characters are `_`, so
    no name (CR/LF included) ever reaches a header as it is."""
    name = PurePosixPath(rel).name
    fallback = "".join(c if " " <= c <= "~" and c not in '"\\' else "_" for c in name) or "file"
    exact = quote(name, safe="", errors="replace")
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{exact}"


def _claim(ctx: ServerContext, caller: Caller, request: Request) -> Claim:
    budget = budget_of(request, "cp_streams_per_user", "`hai cp` streams open")
    return budget.claim(
        caller.name, ctx.config.limits.cp_streams_per_user, "Wait until one of your copies ends"
    )


@dataclass(frozen=True)
class Where:
    """The model dir of a task's latest run, who owns it, the path below it and the account that reads."""

    job_id: int
    model_dir: str
    user: str
    group: str
    rel: str
    account: JobUser | None


def _where(ctx: ServerContext, caller: Caller, job_id: int, path: str, request: Request) -> Where:
    """Where the caller's path is: the task's latest model dir and the account that reads it."""
    with ctx.store.read() as s:
        row = visible_job(s, caller, job_id)
        model_dir = s.scalar(
            select(InstanceRow.model_dir)
            .where(InstanceRow.job_id == row.id, InstanceRow.model_dir.is_not(None))
            .order_by(InstanceRow.id.desc())
            .limit(1)
        )
        user, group = row.user_name, row.group_name
    if not model_dir:
        raise ApiError(
            409,
            f"task {job_id} has not started: it has no model dir yet",
            field="job_id",
            fix=f"Wait until it runs: `hai wait {job_id} --state running`",
        )
    rel = _below(model_dir, path)
    backend = served_backend(request, ctx)
    try:
        account = backend.account(user) if isinstance(backend, Exec) else None
    except KeyError:
        raise ApiError(
            409, f"there is no OS account for {user} on this server", fix="Ask the platform admin"
        ) from None
    return Where(job_id, model_dir, user, group, rel, account)


@contextlib.asynccontextmanager
async def _model_dir(
    ctx: ServerContext, caller: Caller, request: Request, job_id: int, path: str
) -> AsyncIterator[tuple[Where, int]]:
    """Where the caller's path is, and the model dir open (closed after the block); a FileProblem in
    the block leaves it as its 4xx."""
    where = await run_in_threadpool(_where, ctx, caller, job_id, path, request)
    try:
        top = await _open_top(ctx, where)
        try:
            yield where, top
        finally:
            _close(top)
    except FileProblem as problem:
        raise _refused(job_id, where.rel, problem, ctx) from None


async def _open_top(ctx: ServerContext, where: Where) -> int:
    """The model dir, opened by the one confinement routine from the allowed root holding it (no link
    followed at any component), in the cp threads; FileProblem when it may not be."""

    def opening() -> int:
        root = paths.watch_root(ctx.config, ctx.home, where.user, where.group, where.job_id, where.model_dir)
        if root is None:
            raise FileProblem("top", "it is not below a root it may be read from")
        try:
            return open_beneath(root, where.model_dir)
        except UnsafeFile as e:
            raise FileProblem("swapped", str(e.strerror)) from None
        except OSError as e:
            raise FileProblem("top", str(e.strerror or e)) from None

    return await modelfiles.opened_apart(opening)


def _below(model_dir: str, path: str) -> str:
    """`path` as a path below the model dir: relative, or absolute within it; never climbing out."""
    pure = PurePosixPath(path)
    if pure.is_absolute():
        try:
            pure = pure.relative_to(PurePosixPath(model_dir))
        except ValueError:
            raise ApiError(
                422,
                f"{path} is not in the task's model dir {model_dir}",
                field="path",
                fix="Give a path relative to the model dir, e.g. checkpoints/last.pt",
            ) from None
    if ".." in pure.parts:
        raise ApiError(
            422,
            f"{path} climbs out of the model dir with '..'",
            field="path",
            fix="Give a path below the model dir without '..'",
        )
    return "" if str(pure) == "." else str(pure)


@dataclass(frozen=True)
class Words:
    """How one kind of refusal reads: status, error, fix (with {rel}, {job}, {what}, {limit}), field."""

    status: int
    error: str
    fix: str
    field: str = "path"


_WORDS = {
    "missing": Words(
        404, "there is no {rel} in the model dir of task {job}", "List it with `hai cp {job}: --list`"
    ),
    "link": Words(
        403,
        "{rel} is a symbolic link or leads through one: links are not followed",
        "Copy what it points to by its own path",
    ),
    "denied": Words(
        403, "the task's account may not read {rel}", "Only what the task's own account can read is copied"
    ),
    "notfile": Words(409, "{rel} is not a regular file", "Copy regular files or directories of them"),
    "big": Words(
        413,
        "{rel} is {what} bytes, more than the {limit} a download may be",
        "Read it where the task's storage is mounted, or ask the platform admin to raise "
        "[server] max_download_bytes",
    ),
    "top": Words(
        409,
        "the model dir of task {job} cannot be opened on this server: {what}",
        "Read it where the task's storage is mounted",
        "job_id",
    ),
    "swapped": Words(
        403,
        "the model dir of task {job} is not read: {what}; the server never follows a link in a "
        "model dir's path, which someone may have swapped in after the task started",
        "Read it where the task's storage is mounted, or put the directory back in place of the link",
        "spec.model_dir",
    ),
    "stopped": Words(
        409,
        "{what}: the task stopped it, so nothing was copied",
        "Let the task's processes leave the reader alone, then copy again",
        "job_id",
    ),
    "slow": Words(503, "{what}", "Try again later", "job_id"),
}


def _refused(job_id: int, rel: str, problem: FileProblem, ctx: ServerContext) -> ApiError:
    words = _WORDS.get(problem.kind, _WORDS["denied"])
    values = {
        "rel": rel or "the model dir",
        "job": job_id,
        "what": problem.what,
        "limit": ctx.config.server.max_download_bytes,
    }
    return ApiError(
        words.status, words.error.format(**values), field=words.field, fix=words.fix.format(**values)
    )


def _close(top: int) -> None:
    with contextlib.suppress(OSError):
        os.close(top)
