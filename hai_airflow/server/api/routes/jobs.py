"""Job routes: submit, list, show, wait, requeue, and the requests the controller acts on."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from hai_airflow.scheduling.model import WAITING
from hai_airflow.server.api.request_body import strict_body
from hai_airflow.server.api.routes.depends import (
    DB_RECHECK_SECONDS,
    JOB_STATES,
    CallerDep,
    CtxDep,
    SubmissionsDep,
    add_event,
    current_instance,
    listable,
    require_group_admin,
    require_unfinished,
    selected,
    view_of,
    visible_job,
)
from hai_airflow.server.errors import ApiError
from hai_airflow.server.intake import submission
from hai_airflow.server.jobs.auth import Caller
from hai_airflow.server.jobs.holds import held_by, hold_reason, owners_hold
from hai_airflow.server.jobs.views import instance_view, job_detail, job_view
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.store import clock, in_lists
from hai_airflow.server.store.tables import EventRow, InstanceRow, JobRow, UserRow
from hai_airflow.spec import (
    CPU_NEVER_HIGH,
    TERMINAL_STATES,
    ClientKey,
    FilterText,
    HighMaxSchedule,
    InstanceView,
    JobDetailView,
    JobView,
    PrincipalName,
    StoreId,
    SubmitRequest,
    holds_high_priority,
    is_high,
)

router = APIRouter()
DEFAULT_LIST_LIMIT = 1000


class PromoteRequest(BaseModel):
    """Body of `POST /jobs/{id}/promote`."""

    model_config = ConfigDict(extra="forbid")
    max_schedule: HighMaxSchedule = Field(
        description="New expected queueing time in hours, one of 4,6,8,24,48 (high priority)."
    )


class RequeueRequest(BaseModel):
    """Body of `POST /jobs/{id}/requeue`."""

    model_config = ConfigDict(extra="forbid")
    fresh: bool = Field(
        default=False,
        description="Start from scratch, in an empty model dir, instead of from the ended job's latest "
        "checkpoint and its model dir's files (carried over into the new job's own).",
    )


def _states(state: str | None) -> list[str] | None:
    if state is None:
        return None
    states = [p.strip().upper() for p in state.split(",") if p.strip()]
    bad = [p for p in states if p not in JOB_STATES]
    if bad or not states:
        raise ApiError(
            422,
            f"unknown job state {', '.join(bad) or state!r}",
            field="state",
            fix=f"Use one of {', '.join(JOB_STATES)} (comma-separated for several)",
        )
    return states


@router.post("/jobs", status_code=201, responses={200: {"description": "An existing job (same client_key)"}})
async def submit_job(
    body: Annotated[SubmitRequest, strict_body(SubmitRequest)],
    response: Response,
    ctx: CtxDep,
    submissions: SubmissionsDep,
    caller: CallerDep,
) -> JobView:
    submit = submission.Submit(caller, body)
    if body.array is not None:  # many tasks in one transaction of its own
        view, created = await run_in_threadpool(submission.submit_array, ctx, submit)
    else:
        # Awaited on the event loop: the intake stores it with the other submits waiting (group commit).
        view, created = await submissions.put(submit)
    if not created:
        response.status_code = 200
    return view


@router.post(
    "/jobs/{job_id}/requeue",
    status_code=201,
    responses={200: {"description": "The job an earlier requeue of this job made"}},
)
async def requeue_job(
    job_id: StoreId,
    body: Annotated[RequeueRequest, strict_body(RequeueRequest)],
    response: Response,
    ctx: CtxDep,
    submissions: SubmissionsDep,
    caller: CallerDep,
) -> JobView:
    """Run an ended job again as a new job of its owner, linked to it: the same spec, admitted like a
    submit, resuming from its latest checkpoint unless `fresh`. A job is requeued once: asking again
    answers the job the first requeue made."""

    def requeue() -> submission.Submit:
        with ctx.store.read() as s:
            return submission.requeue(s, visible_job(s, caller, job_id), caller, body.fresh)

    view, created = await submissions.put(await run_in_threadpool(requeue))
    if not created:
        response.status_code = 200
    return view


@router.get("/jobs")
def list_jobs(
    ctx: CtxDep,
    caller: CallerDep,
    user: PrincipalName | None = None,
    state: FilterText | None = None,
    group: PrincipalName | None = None,
    client_key: ClientKey | None = None,
    all: bool = False,
    limit: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    before: Annotated[int | None, Query(ge=1, description="Only ids below this: the next page.")] = None,
    selector: Annotated[
        FilterText | None, Query(description="Labels to match: team=vision,stage!=eval,gpu,!draft.")
    ] = None,
    array: Annotated[
        StoreId | None, Query(description="Only the tasks of this array (its first task's id).")
    ] = None,
) -> list[JobView]:
    """Newest first; `before` (the last id of a page) gives the page after it."""
    states = _states(state)
    query = selected(listable(select(JobRow), caller), selector)
    if array is not None:
        query = query.where(JobRow.array_id == array)
    with ctx.store.read() as s:
        if user is not None and user != caller.name and not caller.is_platform_admin:
            owner = s.get(UserRow, user)
            # the same answer whether or not the user exists: a list must not tell who is registered
            if owner is None or not caller.administers(owner.group_name):
                raise ApiError(
                    403,
                    f"you may not list {user}'s tasks",
                    field="user",
                    fix="List your own jobs (leave out --user), or those of a group you administer",
                )
        if user is not None:
            query = query.where(JobRow.user_name == user)
        if group is not None:
            query = query.where(JobRow.group_name == group)
        if client_key is not None:
            # Keys are per user: without `user`, the caller's own key is meant.
            query = query.where(JobRow.client_key == client_key, JobRow.user_name == (user or caller.name))
        if not all and user is None and group is None and client_key is None:
            query = query.where(JobRow.user_name == caller.name)
        if states is not None:
            query = query.where(JobRow.state.in_(states))
        if before is not None:
            query = query.where(JobRow.id < before)
        rows = list(s.scalars(query.order_by(JobRow.id.desc()).limit(limit or DEFAULT_LIST_LIMIT)))
        ids = [r.current_instance_id for r in rows if r.current_instance_id]
        current = in_lists.rows(s, InstanceRow, ids)
        now = clock.now()
        return [job_view(r, current.get(r.current_instance_id or -1), now) for r in rows]


@router.get("/jobs/{job_id}")
def get_job(job_id: StoreId, ctx: CtxDep, caller: CallerDep) -> JobDetailView:
    with ctx.store.read() as s:
        row = visible_job(s, caller, job_id)
        events = list(s.scalars(select(EventRow).where(EventRow.job_id == job_id).order_by(EventRow.id)))
        detail = job_detail(row, current_instance(s, row), events, clock.now())
    latest = ctx.forecast
    if latest is None or detail.state in TERMINAL_STATES:
        return detail
    return detail.model_copy(update={"forecast": latest.view(job_id, full=True, sees=caller.may_see)})


@router.get("/jobs/{job_id}/instances")
def job_instances(job_id: StoreId, ctx: CtxDep, caller: CallerDep) -> list[InstanceView]:
    with ctx.store.read() as s:
        visible_job(s, caller, job_id)
        rows = s.scalars(select(InstanceRow).where(InstanceRow.job_id == job_id).order_by(InstanceRow.id))
        return [instance_view(i) for i in rows]


@router.get("/jobs/{job_id}/wait")
async def wait_job(
    job_id: StoreId,
    ctx: CtxDep,
    caller: CallerDep,
    since_state: FilterText | None = None,
    timeout: Annotated[float, Query(ge=0, le=600)] = 30,
) -> JobView:
    """Long-poll: answers once the state differs from `since_state`, or after `timeout` seconds."""
    if since_state is not None:
        since_state = since_state.upper()
        if since_state not in JOB_STATES:
            raise ApiError(
                422,
                f"unknown job state {since_state!r}",
                field="since_state",
                fix=f"Use one of {', '.join(JOB_STATES)}",
            )

    def load() -> JobView:
        with ctx.store.read() as s:
            return view_of(s, visible_job(s, caller, job_id))

    deadline = time.monotonic() + timeout
    while True:
        view = await run_in_threadpool(load)
        remaining = deadline - time.monotonic()
        if since_state is None or view.state != since_state or remaining <= 0 or ctx.stopping.is_set():
            return view
        # A controller in this process wakes us at once; one in another process is seen by the re-check.
        await ctx.changed.wait(min(DB_RECHECK_SECONDS, remaining))


def _change(
    ctx: ServerContext, caller: Caller, job_id: int, change: Callable[[Session, JobRow], None]
) -> JobView:
    """Apply `change` to the job the caller may see, in one write; wake the controller; answer the job
    as it is now. `change` raises ApiError to refuse, and then nothing is written."""
    with ctx.store.write() as s:
        change(s, visible_job(s, caller, job_id))
    ctx.wakeup.set()
    with ctx.store.read() as s:
        return view_of(s, visible_job(s, caller, job_id))


@router.post("/jobs/{job_id}/cancel")
def cancel_job(job_id: StoreId, ctx: CtxDep, caller: CallerDep) -> JobView:
    """Cancel the job; given an array's id (its first task's), every task of the array not ended yet,
    as `scancel` cancels an array job."""

    def cancel(s: Session, row: JobRow) -> None:
        rows = [row]
        if row.array_id == row.id:
            unfinished = JobRow.state.not_in(TERMINAL_STATES)
            rows = list(s.scalars(select(JobRow).where(JobRow.array_id == row.id, unfinished))) or rows
        require_unfinished(rows[0], "cancel")
        for r in rows:
            if not r.cancel_requested:
                r.cancel_requested, r.cancel_by = True, caller.name
                add_event(s, r, "cancel_requested", f"cancel asked by {caller.name}", caller)

    return _change(ctx, caller, job_id, cancel)


@router.post("/jobs/{job_id}/promote")
def promote_job(
    job_id: StoreId,
    body: Annotated[PromoteRequest, strict_body(PromoteRequest)],
    ctx: CtxDep,
    caller: CallerDep,
) -> JobView:
    def promote(s: Session, row: JobRow) -> None:
        require_unfinished(row, "promote")
        if row.cancel_requested:
            raise ApiError(409, f"task {job_id} is being cancelled", field="job_id", fix="Submit a new task")
        gpus = row.current_workers * row.gpus_per_worker
        if not holds_high_priority(body.max_schedule, gpus):
            raise ApiError(409, f"task {job_id}: {CPU_NEVER_HIGH[0]}", field="job_id", fix=CPU_NEVER_HIGH[1])
        if not is_high(row.max_schedule):
            submission.check_quota(ctx, s, row.user_name, row.group_name, gpus, exclude=(row.id,))
        old = row.max_schedule
        row.max_schedule = body.max_schedule
        add_event(s, row, "promoted", f"max_schedule {old} -> {body.max_schedule} (high priority)", caller)

    return _change(ctx, caller, job_id, promote)


def _hold(s: Session, row: JobRow, caller: Caller) -> None:
    """Hold the job for the caller, once; an admin's hold replaces its owner's (the admin's wins)."""
    if row.held and (not owners_hold(row) or caller.name == row.user_name):
        return
    row.held, row.held_by = True, caller.name
    if row.state in WAITING:
        row.reason = hold_reason(row)
    add_event(s, row, "hold_requested", held_by(row), caller)


def _release(s: Session, row: JobRow, caller: Caller, reason: str) -> None:
    row.held, row.held_by = False, None
    if row.state in WAITING:
        row.reason = submission.QUEUED
    add_event(s, row, "hold_released", reason, caller)


def _not_held(job_id: StoreId) -> ApiError:
    return ApiError(
        409,
        f"task {job_id} is not held",
        field="job_id",
        fix="A preempted job resumes by itself when GPUs free up; see `hai queue`",
    )


@router.post("/jobs/{job_id}/suspend")
def suspend_job(job_id: StoreId, ctx: CtxDep, caller: CallerDep) -> JobView:
    """An admin's hold: the controller stops the job (it resumes from its checkpoint after /resume)."""

    def suspend(s: Session, row: JobRow) -> None:
        require_group_admin(caller, row, "suspend")
        require_unfinished(row, "suspend")
        _hold(s, row, caller)

    return _change(ctx, caller, job_id, suspend)


@router.post("/jobs/{job_id}/resume")
def resume_job(job_id: StoreId, ctx: CtxDep, caller: CallerDep) -> JobView:
    def resume(s: Session, row: JobRow) -> None:
        require_group_admin(caller, row, "resume")
        require_unfinished(row, "resume")
        if not row.held:
            raise _not_held(job_id)
        _release(s, row, caller, f"resumed by admin {caller.name}")

    return _change(ctx, caller, job_id, resume)


@router.post("/jobs/{job_id}/hold")
def hold_job(job_id: StoreId, ctx: CtxDep, caller: CallerDep) -> JobView:
    """Keep a waiting job (PENDING, or SUSPENDED waiting to resume) from being scheduled until
    /release: its owner's hold, or an admin's, which only an admin releases."""

    def hold(s: Session, row: JobRow) -> None:
        require_unfinished(row, "hold")
        if not row.held and row.state not in WAITING:
            raise ApiError(
                409,
                f"cannot hold task {job_id}: it is {row.state}; only a PENDING or SUSPENDED task is held",
                field="job_id",
                fix=f"To stop it and hold it, a group admin runs `hai suspend {job_id}`; "
                f"or stop it for good with `hai cancel {job_id}`",
            )
        _hold(s, row, caller)

    return _change(ctx, caller, job_id, hold)


@router.post("/jobs/{job_id}/release")
def release_job(job_id: StoreId, ctx: CtxDep, caller: CallerDep) -> JobView:
    """Let a held job be scheduled again; the hold's owner, or an admin of its group, releases it."""

    def release(s: Session, row: JobRow) -> None:
        require_unfinished(row, "release")
        if not row.held:
            raise _not_held(job_id)
        if row.held_by != caller.name and not caller.administers(row.group_name):
            raise ApiError(
                403,
                f"task {job_id} is {held_by(row)}; only an admin of group {row.group_name} can release it",
                field="job_id",
                fix=f"Ask {row.held_by} or your group admin to release it",
            )
        _release(s, row, caller, f"released by {caller.name}")

    return _change(ctx, caller, job_id, release)
