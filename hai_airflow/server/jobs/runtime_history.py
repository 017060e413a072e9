"""The store's side of runtime estimates: recent finished runtimes, read in one bounded query, and
what each unfinished job has run so far."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from hai_airflow.scheduling.runtime import FinishedRun, RuntimeFacts
from hai_airflow.server.jobs.kept import KeptInstance, KeptJob
from hai_airflow.server.store.tables import JobRow
from hai_airflow.spec import JobState

RECENT_ENDED = 5000
"""Newest ended jobs read for the history; only those that succeeded count (a failure's runtime says
little about how long the work takes)."""


def recent_runs(session: Session, limit: int = RECENT_ENDED) -> list[FinishedRun]:
    """Runtimes of the jobs that succeeded among the newest `limit` ended ones, newest first: one
    query over the `ended_at` index, whatever the store's size."""
    newest = (
        select(JobRow.user_name, JobRow.group_name, JobRow.task_name, JobRow.runtime_seconds, JobRow.state,
               JobRow.ended_at)
        .where(JobRow.ended_at.is_not(None))
        .order_by(JobRow.ended_at.desc())
        .limit(limit)
        .subquery()
    )
    rows = session.execute(
        select(newest.c.user_name, newest.c.group_name, newest.c.task_name, newest.c.runtime_seconds)
        .where(newest.c.state == JobState.SUCCEEDED)
        .order_by(newest.c.ended_at.desc())
    )
    return [FinishedRun(user, group, task, float(seconds or 0.0)) for user, group, task, seconds in rows]


def runtime_facts(
    rows: Mapping[int, KeptJob], current: Mapping[int, KeptInstance], now: float
) -> dict[int, RuntimeFacts]:
    """Per unfinished job, what its runtime estimate reads; time run counts every run, as its time
    limit does (`KeptJob.seconds_run`)."""
    return {
        job_id: RuntimeFacts(
            job_id=job_id,
            user=row.user_name,
            group=row.group_name,
            task_name=row.task_name,
            time_limit_seconds=row.time_limit_seconds,
            seconds_run=row.seconds_run(current.get(job_id), now),
        )
        for job_id, row in rows.items()
    }
