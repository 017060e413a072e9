"""The store's tables (SQLAlchemy 2 ORM); times are POSIX seconds so SQLite and PostgreSQL agree."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, TypeVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from hai_airflow.spec import JobState, StopKind

W = TypeVar("W", bound=StrEnum)


class WordColumn(TypeDecorator[W]):
    """A word of a closed set (`JobState`, `StopKind`) stored as its value in a plain VARCHAR (no
    database enum type to migrate); a value that is not one of them is refused on the way in and on
    the way out."""

    impl = String(20)
    cache_ok = True

    def __init__(self, words: type[W], what: str) -> None:
        super().__init__()
        self.words, self.what = words, what
        self._by_value: dict[str, W] = {w.value: w for w in words}

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else self.word(value).value

    def process_result_value(self, value: Any, dialect: Dialect) -> W | None:
        return None if value is None else self.word(value)

    def word(self, value: str) -> W:
        word = self._by_value.get(value)
        if word is None:
            raise ValueError(f"{value!r} is not a {self.what}; one of {', '.join(self._by_value)}")
        return word


STATE: WordColumn[JobState] = WordColumn(JobState, "job state")
"""A job's state, as its name."""


class Base(DeclarativeBase):
    pass


class GroupRow(Base):
    """A resource group and its high-priority GPU quota."""

    __tablename__ = "groups"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    quota_gpus: Mapped[int | None] = mapped_column(Integer)
    config_quota: Mapped[str | None] = mapped_column(String(40))
    """The config file's quota as last applied (JSON), so an edited file wins over an older API change."""
    admins: Mapped[str] = mapped_column(Text, default="[]")
    """JSON list of user names that administer the group besides its group_admin members."""


class UserRow(Base):
    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    group_name: Mapped[str] = mapped_column(String(200), ForeignKey("groups.name"))
    role: Mapped[str] = mapped_column(String(20), default="user")
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    """HMAC-SHA256 of the user's API token under the server key (see `server.tokens`); never the token."""
    quota_gpus: Mapped[int | None] = mapped_column(Integer)
    config_quota: Mapped[str | None] = mapped_column(String(40))
    acts_for: Mapped[str] = mapped_column(Text, default="[]")
    """JSON list from the config: whom this service identity may act for (`server.acting`); [] = nobody."""


class NodeRow(Base):
    """A node as the config file gives it, and an admin's drain, which a restart keeps."""

    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    gpu_type: Mapped[str] = mapped_column(String(50))
    gpus: Mapped[int] = mapped_column(Integer)
    cpus: Mapped[float] = mapped_column(Float)
    memory_gb: Mapped[float] = mapped_column(Float)
    virtual: Mapped[bool] = mapped_column(Boolean, default=True)
    drained: Mapped[bool] = mapped_column(Boolean, default=False)
    """No new placement here (the jobs on it run to their end) until an admin undrains it."""
    drained_by: Mapped[str | None] = mapped_column(String(200))
    drained_at: Mapped[float | None] = mapped_column(Float)
    drain_reason: Mapped[str | None] = mapped_column(Text)


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_state", "state"),
        Index("ix_jobs_user", "user_name"),
        Index("ix_jobs_array", "array_id"),
        Index("ix_jobs_ended", "ended_at"),
        # Keys are per user: Airflow's are predictable, so one namespace would let a user claim another's.
        UniqueConstraint("user_name", "client_key", name="uq_jobs_user_client_key"),
        # A job is requeued at most once: a retried requeue finds the job the first one made.
        UniqueConstraint("requeued_from", name="uq_jobs_requeued_from"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_name: Mapped[str] = mapped_column(String(200))
    mode: Mapped[str] = mapped_column(String(20))
    user_name: Mapped[str] = mapped_column(String(200))
    group_name: Mapped[str] = mapped_column(String(200))
    state: Mapped[JobState] = mapped_column(STATE)
    max_schedule: Mapped[int] = mapped_column(Integer, default=0)
    spec: Mapped[str] = mapped_column(Text)
    """The submitted spec as JSON."""
    client_key: Mapped[str | None] = mapped_column(String(250))
    submitted_via: Mapped[str | None] = mapped_column(String(200))
    """The service identity that submitted it for `user_name` (X-Hai-On-Behalf-Of); None when they did."""
    model_id: Mapped[int | None] = mapped_column(Integer)
    project_id: Mapped[int | None] = mapped_column(Integer)
    # Resources resolved from the resource package at submission, so editing packages later
    # never changes what a queued job asked for.
    workers: Mapped[int] = mapped_column(Integer, default=1)
    gpus_per_worker: Mapped[int] = mapped_column(Integer, default=0)
    cpus_per_worker: Mapped[float] = mapped_column(Float, default=0)
    memory_gb_per_worker: Mapped[float] = mapped_column(Float, default=0)
    gpu_type: Mapped[str | None] = mapped_column(String(50))
    elastic: Mapped[bool] = mapped_column(Boolean, default=False)
    min_workers: Mapped[int | None] = mapped_column(Integer)
    """A resizable job's least workers (the spec's `min_workers`); None for one that never resizes."""
    size: Mapped[int | None] = mapped_column(Integer)
    """The workers a resizable job runs at, or resumes at next, after a shrink or a grow; None = `workers`."""
    labels: Mapped[str | None] = mapped_column(Text)
    """The spec's labels as `labels.encode` writes them, for selectors (`,key=value,` sorted)."""
    time_limit_seconds: Mapped[int | None] = mapped_column(Integer)
    """The spec's limit, read by the controller every cycle without parsing the spec."""
    submitted_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)
    suspended_at: Mapped[float | None] = mapped_column(Float)
    last_event_at: Mapped[float | None] = mapped_column(Float)
    """When its newest event happened: the next one is never dated earlier (`transitions.event`)."""
    suspended_seconds: Mapped[float] = mapped_column(Float, default=0)
    runtime_seconds: Mapped[float] = mapped_column(Float, default=0)
    """Seconds run by ended instances (the current one is added when viewed)."""
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    instance_count: Mapped[int] = mapped_column(Integer, default=0)
    current_instance_id: Mapped[int | None] = mapped_column(Integer)
    held: Mapped[bool] = mapped_column(Boolean, default=False)
    """An admin's suspension: the controller keeps the job off the GPUs until resumed."""
    blocked: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    array_id: Mapped[int | None] = mapped_column(Integer)
    """The array it is a task of (`--array`): the id of the array's first task; None outside one."""
    array_index: Mapped[int | None] = mapped_column(Integer)
    """Its index in the array (`HAI_ARRAY_INDEX`)."""
    array_limit: Mapped[int | None] = mapped_column(Integer)
    """At most this many of the array's tasks released at once (`%K`); None: no limit."""
    """It waits for the jobs its spec's `after`/`after_any` name; the controller releases it."""
    held_by: Mapped[str | None] = mapped_column(String(200))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    cancel_by: Mapped[str | None] = mapped_column(String(200))
    reason: Mapped[str | None] = mapped_column(Text)
    latest_checkpoint: Mapped[str | None] = mapped_column(Text)
    latest_checkpoint_at: Mapped[float | None] = mapped_column(Float)
    requeued_from: Mapped[int | None] = mapped_column(Integer)
    """The ended job this one runs again (`hai requeue`), with its spec, owner and checkpoint."""

    @property
    def current_workers(self) -> int:
        """The workers it runs at now (or resumes at): its size after a resize, else all it asked for."""
        return self.size if self.size is not None else self.workers

    def seconds_run(self, current: InstanceRow | None, now: float) -> float:
        """Seconds run over all its runs: the ended instances' and the current one's so far."""
        running_since = None if current is None or current.ended_at is not None else current.started_at
        return time_run(self.runtime_seconds, running_since, now)


def time_run(ended_runs: float, running_since: float | None, now: float) -> float:
    """Seconds run: those of the ended runs, and the running one's so far (when one runs)."""
    if running_since is None:
        return ended_runs
    return ended_runs + max(0.0, now - running_since)


class InstanceRow(Base):
    """One run of a job: where it ran, how to find it again, how it ended."""

    __tablename__ = "instances"
    __table_args__ = (
        Index("ix_instances_job", "job_id"),
        Index("ix_instances_ended", "ended_at"),
        Index("ix_instances_credential", "credential_hash", unique=True),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(Integer, ForeignKey("jobs.id"))
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)
    placement: Mapped[str] = mapped_column(Text, default="[]")
    gpus: Mapped[int | None] = mapped_column(Integer)
    """GPUs the run holds (a resized job's runs differ); None for runs stored before it was kept."""
    handle: Mapped[str | None] = mapped_column(Text)
    """The backend's Handle.data as JSON; None until the backend has started it."""
    pid: Mapped[int | None] = mapped_column(Integer)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    end_reason: Mapped[str | None] = mapped_column(String(20))
    preempted_by: Mapped[int | None] = mapped_column(Integer)
    resume: Mapped[bool] = mapped_column(Boolean, default=False)
    checkpoint: Mapped[str | None] = mapped_column(Text)
    log_path: Mapped[str] = mapped_column(Text)
    work_dir: Mapped[str] = mapped_column(Text)
    model_dir: Mapped[str] = mapped_column(Text)
    stop_kind: Mapped[StopKind | None] = mapped_column(WordColumn(StopKind, "stop kind"))
    """Why the controller asked it to stop; None while it is not being stopped."""
    stop_requested_at: Mapped[float | None] = mapped_column(Float)
    grace_seconds: Mapped[int] = mapped_column(Integer, default=0)
    controller: Mapped[str | None] = mapped_column(String(250))
    """The lease holder that started it."""
    lost_gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    """GPU-seconds of work it lost when it was stopped to resume later (past its job's latest checkpoint)."""
    credential_hash: Mapped[str | None] = mapped_column(String(64))
    """The keyed hash of its job credential (`server.tokens`), the token `hai` inside the run acts for
    the job's owner with; never the token. None for runs started before credentials existed."""


class EventRow(Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_job", "job_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(Integer, ForeignKey("jobs.id"))
    at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(40))
    from_state: Mapped[JobState | None] = mapped_column(STATE)
    to_state: Mapped[JobState | None] = mapped_column(STATE)
    reason: Mapped[str] = mapped_column(Text, default="")
    actor: Mapped[str] = mapped_column(String(250), default="controller")


class ReservationRow(Base):
    """GPUs held for a preemptor while its victims stop."""

    __tablename__ = "reservations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(Integer, ForeignKey("jobs.id"))
    node: Mapped[str] = mapped_column(String(200))
    gpus: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)


class LeaseRow(Base):
    """One row: which controller may act on this store, until when."""

    __tablename__ = "controller_lease"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    holder: Mapped[str] = mapped_column(String(250), default="")
    expires_at: Mapped[float] = mapped_column(Float, default=0)
    acquired_at: Mapped[float] = mapped_column(Float, default=0)


class SettingRow(Base):
    """Facts about the store itself, by name (e.g. the fingerprint of the token key)."""

    __tablename__ = "store_settings"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class ChangeRow(Base):
    """The change feed: one row per transaction and thing it changed (`server.changes`).

    The controller keeps its cluster state by reading the rows after the last one it applied, in
    (transaction, id) order.
    """

    __tablename__ = "changes"
    __table_args__ = (
        Index("ix_changes_txn_id", "txn", "id"),
        {"sqlite_autoincrement": True},  # ids never reused once old rows are trimmed
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    txn: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    """The writing transaction's id on PostgreSQL (0 on SQLite, whose writers take turns)."""
    kind: Mapped[str] = mapped_column(String(20))
    """job (a job, its instances or its reservations), quota or nodes."""
    job_id: Mapped[int | None] = mapped_column(Integer)
    at: Mapped[float] = mapped_column(Float)
