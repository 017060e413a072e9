"""`GET /jobs/{id}/files[/content]`: a task's model dir listed, and its files downloaded (`hai cp`)."""

from __future__ import annotations

import contextlib
import os
from pathlib import PurePosixPath
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import iterate_in_threadpool, run_in_threadpool
from fastapi.responses import StreamingResponse
from sqlalchemy import select

from hai_airflow.backends.confine import open_beneath
from hai_airflow.backends.execs import Exec
from hai_airflow.backends.jobuser import JobUser
from hai_airflow.endpoints import BYTES
from hai_airflow.server import modelfiles, paths
from hai_airflow.server.auth import Caller
from hai_airflow.server.context import ServerContext
from hai_airflow.server.errors import ApiError
from hai_airflow.server.modelfiles import FileProblem, Top
from hai_airflow.server.routes.deps import CallerDep, CtxDep, visible_job
from hai_airflow.server.routes.served import served_backend
from hai_airflow.server.tables import InstanceRow
from hai_airflow.spec import MAX_PATH_CHARS, FilesView, StoreId

router = APIRouter()


FilePath = Annotated[
    str,
    Query(
        max_length=MAX_PATH_CHARS,
        pattern=r"^[^\x00]*$",
        description="A path below the task's model dir ('' for the dir itself), or the whole path.",
    ),
]


@router.get("/jobs/{job_id}/files")
def list_files(
    job_id: StoreId, ctx: CtxDep, caller: CallerDep, request: Request, path: FilePath = ""
) -> FilesView:
    """What a path below the task's model dir is, and a directory's entries (links are listed, never
    followed). The task's owner and the admins of its group may look, with the rights of the task's
    own account."""
    top, rel, account = _where(ctx, caller, job_id, path, request)
    try:
        return FilesView.model_validate(modelfiles.listing(top, rel, account))
    except FileProblem as problem:
        raise _refused(job_id, rel, problem, ctx) from None
    finally:
        _close(top)


@router.get(
    "/jobs/{job_id}/files/content",
    response_class=StreamingResponse,
    responses={200: {"content": {BYTES: {}}, "description": "The file's bytes"}},
)
async def file_content(
    job_id: StoreId, ctx: CtxDep, caller: CallerDep, request: Request, path: FilePath = ""
) -> StreamingResponse:
    """A regular file below the task's model dir, streamed; one larger than `[server]
    max_download_bytes` is refused (413)."""
    top, rel, account = await run_in_threadpool(_where, ctx, caller, job_id, path, request)
    limit = ctx.config.server.max_download_bytes
    try:
        opened = await run_in_threadpool(modelfiles.open_file, top, rel, limit, account)
    except FileProblem as problem:
        raise _refused(job_id, rel, problem, ctx) from None
    finally:
        _close(top)
    name = PurePosixPath(rel).name.replace('"', "")
    headers = {"Content-Length": str(opened.size), "Content-Disposition": f'attachment; filename="{name}"'}
    return StreamingResponse(iterate_in_threadpool(opened.chunks()), media_type=BYTES, headers=headers)


def _where(
    ctx: ServerContext, caller: Caller, job_id: int, path: str, request: Request
) -> tuple[Top, str, JobUser | None]:
    """The model dir of the task's latest run, the path below it, and the account that reads it."""
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
    if (account.uid if account is not None else os.geteuid()) != 0:
        return Top(model_dir), rel, account
    root = paths.watch_root(ctx.config, ctx.home, user, group, job_id, model_dir)
    try:
        if root is None:
            raise PermissionError("not below a root it may use")
        return Top(model_dir, open_beneath(root, model_dir)), rel, account
    except OSError as e:
        raise ApiError(
            409,
            f"the model dir of task {job_id} cannot be read on this server: {e.strerror or e}",
            fix="Read it where the task's storage is mounted",
        ) from None


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


_WORDS = {
    "missing": (
        404,
        "there is no {rel} in the model dir of task {job}",
        "List it with `hai cp {job}: --list`",
    ),
    "link": (
        403,
        "{rel} is a symbolic link or leads through one: links are not followed",
        "Copy what it points to by its own path",
    ),
    "denied": (
        403,
        "the task's account may not read {rel}",
        "Only what the task's own account can read is copied",
    ),
    "notfile": (409, "{rel} is not a regular file", "Copy regular files or directories of them"),
    "big": (
        413,
        "{rel} is {what} bytes, more than the {limit} a download may be",
        "Read it where the task's storage is mounted, or ask the platform admin to raise "
        "[server] max_download_bytes",
    ),
    "top": (
        409,
        "the model dir of task {job} cannot be opened on this server: {what}",
        "Read it where the task's storage is mounted",
    ),
    "slow": (503, "{what}", "Try again later"),
}


def _refused(job_id: int, rel: str, problem: FileProblem, ctx: ServerContext) -> ApiError:
    status, error, fix = _WORDS.get(problem.kind, _WORDS["denied"])
    words = {
        "rel": rel or "the model dir",
        "job": job_id,
        "what": problem.what,
        "limit": ctx.config.server.max_download_bytes,
    }
    return ApiError(status, error.format(**words), field="path", fix=fix.format(**words))


def _close(top: Top) -> None:
    if top.fd is not None:
        with contextlib.suppress(OSError):
            os.close(top.fd)
