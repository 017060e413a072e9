"""What every route needs: the server context, the caller, and jobs the caller may see."""

from __future__ import annotations

from typing import Annotated, TypeVar

from fastapi import Depends, Request
from sqlalchemy import Select
from sqlalchemy.orm import Session

from hai_airflow.labels import parse_selector
from hai_airflow.server.errors import ApiError, not_found
from hai_airflow.server.intake.submission import REQUEUABLE, Submissions
from hai_airflow.server.jobs import transitions
from hai_airflow.server.jobs.auth import Caller, authenticate
from hai_airflow.server.jobs.views import job_view
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.store import clock
from hai_airflow.server.store.tables import InstanceRow, JobRow
from hai_airflow.spec import TERMINAL_STATES, JobState, JobView

Q = TypeVar("Q", bound=Select)
JOB_STATES: tuple[str, ...] = tuple(JobState)
DB_RECHECK_SECONDS = 1.0
"""How often a long-poll or a followed log looks at the store again (another process may change it)."""


async def _ctx(request: Request) -> ServerContext:
    # async: FastAPI would run a plain function in the thread pool, a hop per request for an attribute.
    ctx: ServerContext = request.app.state.ctx
    return ctx


CtxDep = Annotated[ServerContext, Depends(_ctx)]


async def _submissions(request: Request) -> Submissions:
    submissions: Submissions = request.app.state.submissions
    return submissions


SubmissionsDep = Annotated[Submissions, Depends(_submissions)]
CallerDep = Annotated[Caller, Depends(authenticate)]


def listable(query: Q, caller: Caller) -> Q:
    """The query narrowed to the jobs the caller may list: their own and those of the groups they
    administer; a platform admin's, every job."""
    if caller.is_platform_admin:
        return query
    return query.where((JobRow.user_name == caller.name) | JobRow.group_name.in_(sorted(caller.admin_of)))


def selected(query: Q, selector: str | None) -> Q:
    """The query narrowed to the jobs whose labels the selector matches; 422 for a bad selector."""
    if selector is None:
        return query
    try:
        requirements = parse_selector(selector)
    except ValueError as error:
        raise ApiError(422, str(error), field="selector", fix="Write it as team=vision,stage!=eval") from None
    for r in requirements:
        pair = f",{r.key}={r.value}," if r.op in ("=", "!=") else f",{r.key}="
        has = JobRow.labels.contains(pair, autoescape=True)
        query = query.where(has if r.op in ("=", "exists") else (JobRow.labels.is_(None) | ~has))
    return query


def visible_job(s: Session, caller: Caller, job_id: int) -> JobRow:
    """The job if the caller may see it; otherwise it does not exist for them."""
    row = s.get(JobRow, job_id)
    if row is None or not caller.may_see(row.user_name, row.group_name):
        raise not_found("task", job_id, fix="List your tasks with `hai task`")
    return row


def current_instance(s: Session, row: JobRow) -> InstanceRow | None:
    return s.get(InstanceRow, row.current_instance_id) if row.current_instance_id else None


def view_of(s: Session, row: JobRow) -> JobView:
    return job_view(row, current_instance(s, row), clock.now())


def require_unfinished(row: JobRow, action: str) -> None:
    if row.state in TERMINAL_STATES:
        raise ApiError(
            409,
            f"cannot {action} task {row.id}: it already ended ({row.state})",
            field="job_id",
            fix=f"`hai requeue {row.id}` runs it again as a new task"
            if row.state in REQUEUABLE
            else "Submit it again if it should run again",
        )


def add_event(s: Session, row: JobRow, kind: str, reason: str, caller: Caller) -> None:
    """Record what the caller asked of the job; a service acting for them is named in the reason."""
    if caller.via is not None:
        reason += f" (via {caller.via})"
    transitions.event(s, row, kind, reason, clock.now(), actor=caller.name)


def require_group_admin(caller: Caller, row: JobRow, action: str) -> None:
    if not caller.administers(row.group_name):
        raise ApiError(
            403,
            f"only an admin of group {row.group_name} can {action} jobs",
            field="job_id",
            fix="Ask your group admin, or cancel the job yourself",
        )


def visible_instance(s: Session, caller: Caller, instance_id: int) -> InstanceRow:
    inst = s.get(InstanceRow, instance_id)
    job = s.get(JobRow, inst.job_id) if inst is not None else None
    if inst is None or job is None or not caller.may_see(job.user_name, job.group_name):
        raise not_found("instance", instance_id, fix="List a task's instances with `hai instance N`")
    return inst
