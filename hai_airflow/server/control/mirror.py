"""The controller's kept copy of the store: the planner's cluster state plus records of the jobs and
instances the controller acts on, brought up to date by the store's change feed instead of re-read
every cycle."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from sqlalchemy.orm import Session

from hai_airflow.scheduling.model import Reservation
from hai_airflow.scheduling.state import ClusterState
from hai_airflow.server.jobs.dependencies import Waits
from hai_airflow.server.jobs.kept import KeptInstance, KeptJob, kept_jobs
from hai_airflow.server.jobs.snapshot import (
    StoreView,
    current_instances,
    nodes_of,
    planner_job,
    quota_of,
    reservations_of,
    schedulable,
)
from hai_airflow.server.store import changes, in_lists
from hai_airflow.server.store.tables import JobRow
from hai_airflow.spec import TERMINAL_STATES

log = logging.getLogger("hai.server.follow")


@dataclass
class Kept:
    """What a full read of the store gives; `StoreFollower` keeps one up to date."""

    state: ClusterState
    jobs: dict[int, KeptJob]
    """Every unfinished job's record, including admin-held ones the planner does not see."""
    current: dict[int, KeptInstance]
    """Current (not ended) instance by job id."""
    last_change: changes.Cursor
    """The newest change of the feed already applied."""
    requests: set[int] = field(default_factory=set)
    """Unfinished jobs with a cancel asked for or held by an admin: the controller acts on these."""
    limited: set[int] = field(default_factory=set)
    """Unfinished jobs with a time limit: the controller checks their time used every cycle."""
    blocked: dict[int, Waits] = field(default_factory=dict)
    """Jobs waiting for other jobs, and for which: the controller releases or cancels them."""

    def keep(self, job: KeptJob) -> None:
        """Keep an unfinished job's record (and what is read from it every cycle)."""
        self.jobs[job.id] = job
        if job.cancel_requested or job.held:
            self.requests.add(job.id)
        else:
            self.requests.discard(job.id)
        if job.time_limit_seconds is not None:
            self.limited.add(job.id)
        if job.blocked and job.id not in self.blocked:
            self.blocked[job.id] = Waits.of_job(job)
        elif not job.blocked:
            self.blocked.pop(job.id, None)

    def reason_written(self, job_id: int, reason: str) -> None:
        """Keep the waiting reason the controller just wrote, as a reason is not a change the feed
        carries."""
        self.jobs[job_id] = replace(self.jobs[job_id], reason=reason)

    def forget(self, job_id: int) -> None:
        self.jobs.pop(job_id, None)
        self.current.pop(job_id, None)
        self.requests.discard(job_id)
        self.limited.discard(job_id)
        self.blocked.pop(job_id, None)

    def view(self) -> StoreView:
        return StoreView(
            snapshot=self.state.snapshot(), usage=self.state.usage, jobs=self.jobs, current=self.current
        )


def read_all(session: Session, policy: str) -> Kept:
    """The whole store, read once (at start, on taking the lease, and to check the kept copy)."""
    last = changes.newest(session)  # first: a change committed during the read is applied again later
    unfinished = kept_jobs(session, JobRow.state.not_in(TERMINAL_STATES))
    current = current_instances(session)
    jobs = (planner_job(j, current.get(j.id)) for j in unfinished if schedulable(j))
    state = ClusterState.load(nodes_of(session), jobs, reservations_of(session), quota_of(session), policy)
    kept = Kept(state, {}, current, last)
    for j in unfinished:
        kept.keep(j)
    return kept


class StoreFollower:
    """Keeps `Kept` in step with the store by applying the change feed; `view()` is one cycle's input."""

    def __init__(self, policy: str):
        self.policy = policy
        self.kept: Kept | None = None

    def load(self, session: Session) -> None:
        self.kept = read_all(session, self.policy)

    def catch_up(self, session: Session) -> int:
        """Apply the changes committed since the last one applied; returns how many were read."""
        if self.kept is None:
            self.load(session)
            return 0
        fresh = changes.since(session, self.kept.last_change)
        if not fresh:
            return 0
        job_ids = {c.job_id for c in fresh if c.kind == changes.JOB and c.job_id is not None}
        if any(c.kind == changes.QUOTA for c in fresh):
            self.kept.state.quota_changed(quota_of(session))
        if any(c.kind == changes.NODES for c in fresh):
            self.kept.state.nodes_changed(nodes_of(session))
        if job_ids:
            self._refresh(session, job_ids)
        self.kept.last_change = changes.cursor(fresh[-1])
        return len(fresh)

    def _refresh(self, session: Session, job_ids: set[int]) -> None:
        """Read these jobs' rows, current instances and reservations again and keep them as records."""
        assert self.kept is not None
        kept, state = self.kept, self.kept.state
        parts = in_lists.chunks(sorted(job_ids))
        found = {j.id: j for part in parts for j in kept_jobs(session, JobRow.id.in_(part))}
        current = current_instances(session, job_ids)
        reserved: dict[int, list[Reservation]] = {}
        for r in reservations_of(session, job_ids):
            reserved.setdefault(r.job_id, []).append(r)
        for job_id in sorted(job_ids):
            job = found.get(job_id)
            if job is None or job.state in TERMINAL_STATES:
                kept.forget(job_id)
                state.job_left(job_id)
                state.reservation_cleared(job_id)
                continue
            kept.keep(job)
            inst = current.get(job_id)
            if inst is None:
                kept.current.pop(job_id, None)
            else:
                kept.current[job_id] = inst
            if schedulable(job):
                state.job_changed(planner_job(job, inst))
            else:
                state.job_left(job_id)
            if job_id in reserved:
                state.reserved(job_id, reserved[job_id])
            else:
                state.reservation_cleared(job_id)

    def view(self) -> StoreView:
        assert self.kept is not None, "catch_up() first"
        return self.kept.view()

    @property
    def state(self) -> ClusterState:
        """The kept cluster state, as the feed has brought it up to date."""
        assert self.kept is not None, "catch_up() first"
        return self.kept.state


def differences(kept: Kept, fresh: Kept) -> list[str]:
    """Where a kept copy differs from a fresh read, in words (empty when they agree)."""
    out: list[str] = []
    a, b = kept.state, fresh.state
    if a.nodes != b.nodes:
        out.append("nodes")
    if a.quota != b.quota:
        out.append("quota")
    if a.jobs != b.jobs:
        out.append(f"jobs {_differing(a.jobs, b.jobs)[:10]}")
    if a.reservations != b.reservations:
        out.append("reservations")
    if kept.jobs != fresh.jobs:
        out.append(f"records of jobs {_differing(kept.jobs, fresh.jobs)[:10]}")
    if kept.requests != fresh.requests:
        out.append("requests")
    if kept.current != fresh.current:
        out.append(f"current instances of jobs {_differing(kept.current, fresh.current)[:10]}")
    if counted(a) != counted(b):
        out.append("usage")
    return out


def _differing(kept: Mapping[int, object], fresh: Mapping[int, object]) -> list[int]:
    """The ids whose records differ, or that only one side has."""
    return sorted(i for i in kept.keys() | fresh.keys() if kept.get(i) != fresh.get(i))


def counted(state: ClusterState) -> tuple[object, ...]:
    """The usage's figures, without the zero counts a job that went away leaves behind."""
    u = state.usage
    return (
        u.free,
        u.buckets,
        {k: v for k, v in u.user_high.items() if v},
        {k: v for k, v in u.group_high.items() if v},
    )
