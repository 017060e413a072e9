"""`GET /jobs/revision`: a long-poll over the caller's task list, so a watch sees a task submitted
after it started at once rather than at its next refresh."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hai_airflow.server.api.routes.depends import DB_RECHECK_SECONDS, CallerDep, CtxDep, listable
from hai_airflow.server.jobs.auth import Caller
from hai_airflow.server.store.tables import ChangeRow, JobRow
from hai_airflow.spec import FilterText, RevisionView

router = APIRouter()


def revision(s: Session, caller: Caller) -> str:
    """The change feed's rows of the jobs the caller may list, counted, with the newest id: every
    write to one of them adds a row, so the pair moves (ids alone need not: on PostgreSQL a later
    commit may hold a lower id)."""
    query = select(func.count(ChangeRow.id), func.max(ChangeRow.id))
    count, newest = s.execute(listable(query.join(JobRow, JobRow.id == ChangeRow.job_id), caller)).one()
    return f"{count}.{newest or 0}"


@router.get("/jobs/revision")
async def jobs_revision(
    ctx: CtxDep,
    caller: CallerDep,
    after: FilterText | None = None,
    timeout: Annotated[float, Query(ge=0, le=600)] = 0,
) -> RevisionView:
    """Long-poll: answers once the revision of the caller's task list differs from `after` (at once
    without it), or after `timeout` seconds."""

    def load() -> str:
        with ctx.store.read() as s:
            return revision(s, caller)

    deadline = time.monotonic() + timeout
    while True:
        now = await run_in_threadpool(load)
        remaining = deadline - time.monotonic()
        if after is None or now != after or remaining <= 0 or ctx.stopping.is_set():
            return RevisionView(revision=now)
        await ctx.changed.wait(min(DB_RECHECK_SECONDS, remaining))
