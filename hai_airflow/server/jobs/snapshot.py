"""Reading the store into the planner's immutable snapshot."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from hai_airflow.scheduling.model import (
    Job,
    Node,
    Placement,
    Quota,
    Reservation,
    Snapshot,
    WorkerPlacement,
)
from hai_airflow.scheduling.usage import Usage
from hai_airflow.server.jobs.kept import KeptInstance, KeptJob, kept_instances
from hai_airflow.server.store import in_lists
from hai_airflow.server.store.tables import GroupRow, InstanceRow, JobRow, NodeRow, ReservationRow, UserRow
from hai_airflow.spec import PLACED as PLACED  # re-exported for the server's readers of the store
from hai_airflow.spec import TERMINAL_STATES, JobState
from hai_airflow.spec import WAITING as WAITING


def placement_from_json(text: str | None) -> Placement:
    if not text:
        return ()
    return tuple(
        WorkerPlacement(
            node=w["node"], gpus=tuple(w["gpus"]), cpus=w.get("cpus", 0), memory_gb=w.get("memory_gb", 0)
        )
        for w in json.loads(text)
    )


def placement_to_json(placement: Placement) -> str:
    return json.dumps(
        [{"node": w.node, "gpus": list(w.gpus), "cpus": w.cpus, "memory_gb": w.memory_gb} for w in placement]
    )


@dataclass(frozen=True)
class StoreView:
    """One consistent read of what the planner and the API views need."""

    snapshot: Snapshot
    usage: Usage
    """What the placed jobs use, kept beside the snapshot and handed with it to `plan`."""
    jobs: Mapping[int, KeptJob]
    """Every unfinished job by id, including admin-held ones the planner does not see."""
    current: Mapping[int, KeptInstance]
    """Current (not ended) instance by job id."""


def planner_job(row: KeptJob, current: KeptInstance | None) -> Job:
    """The planner's view of a kept job; one that is being stopped counts as SUSPENDING.

    A job asked to stop (cancel or an admin's suspension) must not be picked as a victim again,
    yet still holds its GPUs until its instance exits.
    """
    state = row.state
    if state in PLACED and current is not None and current.stop_kind is not None:
        state = JobState.SUSPENDING
    return Job(
        id=row.id,
        user=row.user_name,
        group=row.group_name,
        state=state,
        max_schedule=row.max_schedule,
        submitted_at=row.submitted_at,
        workers=row.current_workers,
        gpus_per_worker=row.gpus_per_worker,
        cpus_per_worker=row.cpus_per_worker,
        memory_gb_per_worker=row.memory_gb_per_worker,
        gpu_type=row.gpu_type,
        started_at=row.started_at if state in PLACED else None,
        placement=placement_from_json(current.placement) if current is not None else (),
        suspended_seconds=row.suspended_seconds,
        suspended_at=row.suspended_at,
        preemptions=row.preemptions,
        last_checkpoint_at=row.latest_checkpoint_at,
        elastic=row.elastic,
        min_workers=row.min_workers or 0,
        max_workers=row.workers if row.min_workers else 0,
    )


def schedulable(row: JobRow | KeptJob) -> bool:
    """Waiting jobs that are held, waiting for other jobs, or whose cancel is pending are kept from
    the planner."""
    if row.state in WAITING:
        return not row.held and not row.cancel_requested and not row.blocked
    return row.state in PLACED


def quota_of(session: Session) -> Quota:
    groups = {g.name: g.quota_gpus for g in session.scalars(select(GroupRow))}
    users = {u.name: u.quota_gpus for u in session.scalars(select(UserRow))}
    return Quota(groups=groups, users=users)


def nodes_of(session: Session) -> tuple[Node, ...]:
    rows = session.scalars(select(NodeRow).order_by(NodeRow.name))
    return tuple(Node(r.name, r.gpu_type, r.gpus, r.cpus, r.memory_gb, r.drained) for r in rows)


def unfinished_jobs(session: Session) -> list[JobRow]:
    return list(
        session.scalars(select(JobRow).where(JobRow.state.not_in(TERMINAL_STATES)).order_by(JobRow.id))
    )


def current_instances(session: Session, job_ids: Iterable[int] | None = None) -> dict[int, KeptInstance]:
    """Current (not ended) instances by job id (of these jobs only, when given)."""
    current = InstanceRow.ended_at.is_(None)
    if job_ids is None:
        return {i.job_id: i for i in kept_instances(session, current)}
    return {
        i.job_id: i
        for part in in_lists.chunks(job_ids)
        for i in kept_instances(session, current, InstanceRow.job_id.in_(part))
    }


def reservations_of(session: Session, job_ids: Iterable[int] | None = None) -> list[Reservation]:
    """Reserved GPUs, oldest first (of these jobs only, when given)."""
    query = select(ReservationRow).order_by(ReservationRow.id)
    if job_ids is None:
        found = list(session.scalars(query))
    else:
        found = []
        for part in in_lists.chunks(job_ids):
            found.extend(session.scalars(query.where(ReservationRow.job_id.in_(part))))
        found.sort(key=lambda r: r.id)
    return [Reservation(r.job_id, r.node, tuple(json.loads(r.gpus))) for r in found]
