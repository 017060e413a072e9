"""The controller's kept records of the unfinished jobs and their current instances: plain frozen copies
of the columns it reads, replaced whole on a change (`dataclasses.replace`), never mutated."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from hai_airflow.server.store.tables import InstanceRow, JobRow, time_run
from hai_airflow.spec import JobState, StopKind


@dataclass(frozen=True, slots=True)
class KeptInstance:
    """A job's current (not ended) instance, as the controller reads it."""

    id: int
    job_id: int
    started_at: float | None
    placement: str
    """The workers' nodes and GPUs as JSON (`snapshot.placement_from_json`)."""
    handle: str | None
    """The backend's handle as JSON; None until the backend has started it."""
    stop_kind: StopKind | None
    """Why the controller asked it to stop; None while it is not being stopped."""


@dataclass(frozen=True, slots=True)
class KeptJob:
    """An unfinished job, as the controller, the planner's input and the forecaster read it."""

    id: int
    task_name: str
    user_name: str
    group_name: str
    state: JobState
    max_schedule: int
    spec: str
    """The submitted spec as JSON (`admission.parse_spec`)."""
    workers: int
    size: int | None
    gpus_per_worker: int
    cpus_per_worker: float
    memory_gb_per_worker: float
    gpu_type: str | None
    elastic: bool
    min_workers: int | None
    time_limit_seconds: int | None
    submitted_at: float
    started_at: float | None
    suspended_at: float | None
    suspended_seconds: float
    runtime_seconds: float
    preemptions: int
    latest_checkpoint_at: float | None
    held: bool
    held_by: str | None
    blocked: bool
    cancel_requested: bool
    cancel_by: str | None
    array_id: int | None
    array_index: int | None
    array_limit: int | None
    reason: str | None

    @property
    def current_workers(self) -> int:
        """The workers it runs at now (or resumes at), as `JobRow.current_workers`."""
        return self.size if self.size is not None else self.workers

    def seconds_run(self, current: KeptInstance | None, now: float) -> float:
        """Seconds run over all its runs, as `JobRow.seconds_run`."""
        return time_run(self.runtime_seconds, None if current is None else current.started_at, now)


def _columns(record: type[KeptInstance | KeptJob], table: type[InstanceRow | JobRow]) -> tuple[Any, ...]:
    """The table's columns a record's fields are read from: those of the same names, in order."""
    return tuple(getattr(table, f.name) for f in fields(record))


_INSTANCE, _JOB = _columns(KeptInstance, InstanceRow), _columns(KeptJob, JobRow)


def kept_instances(session: Session, *where: ColumnElement[bool]) -> list[KeptInstance]:
    """The records of the instances `where` selects, read as plain columns: no ORM row is built, which
    would cost three times as long at a full read of a large queue."""
    return [KeptInstance(*r) for r in session.execute(select(*_INSTANCE).where(*where))]


def kept_jobs(session: Session, *where: ColumnElement[bool]) -> list[KeptJob]:
    """The records of the jobs `where` selects, by id, read as plain columns (as `kept_instances`)."""
    return [KeptJob(*r) for r in session.execute(select(*_JOB).where(*where).order_by(JobRow.id))]
