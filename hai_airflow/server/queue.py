"""The queue as users see it: order, priority weight with its terms, and why each job waits;
others' jobs only as what the queue needs."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from hai_airflow.scheduling import plan, weight
from hai_airflow.scheduling.model import Admit, Reject, Wait
from hai_airflow.server import by_id, clock
from hai_airflow.server.auth import Caller
from hai_airflow.server.follow import read_all
from hai_airflow.server.forecasting import QueueForecast
from hai_airflow.server.holds import hold_reason, owners_hold
from hai_airflow.server.snapshot import WAITING, planner_job, unfinished_jobs
from hai_airflow.server.tables import InstanceRow, JobRow
from hai_airflow.server.views import job_view, other_job_view
from hai_airflow.spec import QueueEntryView, QueueJobView, WeightTermView


def _last_preemptor(session: Session, job_ids: list[int]) -> dict[int, int]:
    """Per job, who preempted its latest instance (when that instance was preempted)."""
    if not job_ids:
        return {}
    last: dict[int, int | None] = {}
    for part in by_id.chunks(job_ids):
        rows = session.execute(
            select(InstanceRow.job_id, InstanceRow.preempted_by)
            .where(InstanceRow.job_id.in_(part))
            .order_by(InstanceRow.id)
        )
        for job_id, by in rows:  # a job's instances all fall in its own chunk, in id order
            last[job_id] = by
    return {j: by for j, by in last.items() if by is not None}


def queued_job(row: JobRow, caller: Caller, now: float) -> QueueJobView:
    """The job in full if the caller may see it (`Caller.may_see`), else only what the queue needs."""
    if caller.may_see(row.user_name, row.group_name):
        return job_view(row, None, now)
    return other_job_view(row)


def _unplanned_reason(row: JobRow, shown: bool) -> str:
    """Why a job the planner skipped waits; who asked is named only to those who may see the job."""
    if row.cancel_requested:
        return f"being cancelled (asked by {row.cancel_by})" if shown else "being cancelled"
    if row.blocked and not row.held:
        return (row.reason or "waiting for other tasks") if shown else "waiting for other tasks"
    if shown:
        return hold_reason(row)
    return "held by its owner" if owners_hold(row) else "suspended by an admin"


def queue_entries(
    session: Session, policy: str, caller: Caller, now: float | None = None,
    forecast: QueueForecast | None = None,
) -> list[QueueEntryView]:
    """Waiting jobs in the order a fresh plan would serve them, each with its `forecast` (another
    user's with the time only); held ones last."""
    now = clock.now() if now is None else now
    view = read_all(session, policy).view()
    decisions = plan(view.snapshot, now, view.usage)
    rows = {r.id: r for r in unfinished_jobs(session)}  # shown in full, beyond what the controller keeps
    waiting = [r for r in rows.values() if r.state in WAITING]
    preempted_by = _last_preemptor(session, [r.id for r in waiting])
    entries: list[QueueEntryView] = []

    def add(job_id: int, reason: str, behind: int | None) -> None:
        row = rows[job_id]
        w = weight(planner_job(view.jobs[job_id], None), now)
        shown = caller.may_see(row.user_name, row.group_name)
        entries.append(
            QueueEntryView(
                position=len(entries) + 1,
                job=queued_job(row, caller, now),
                weight=w.score,
                terms=tuple(WeightTermView(name=t.name, value=t.value, note=t.note) for t in w.terms),
                reason=reason,
                waiting_behind=behind,
                preempted_by=preempted_by.get(job_id),
                forecast=forecast.view(job_id, full=shown) if forecast is not None else None,
            )
        )

    for d in decisions:
        if isinstance(d, Admit):
            add(d.job_id, f"starting: {d.reason}", None)
        elif isinstance(d, Wait):
            add(d.job_id, d.reason, d.blocked_by)
        elif isinstance(d, Reject):
            add(d.job_id, f"cannot run: {d.reason}", None)
    planned = {e.job.id for e in entries}
    for row in sorted(waiting, key=lambda r: r.id):
        if row.id not in planned and (row.cancel_requested or row.held or row.blocked):
            add(row.id, _unplanned_reason(row, caller.may_see(row.user_name, row.group_name)), None)
    return entries
