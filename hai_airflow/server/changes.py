"""The change feed: each write transaction records which jobs it changed (and whether quotas or
nodes changed), in commit order, so the controller keeps its cluster state without re-reading the store.

Rows are collected from the session's flushes, so every ORM write is seen without the writer saying
so; a Core statement that changes a job's planning inputs calls `job_changed` itself.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from itertools import chain
from typing import Any

from sqlalchemy import delete, event, func, insert, select, text
from sqlalchemy.orm import Session, sessionmaker

from hai_airflow.server.tables import (
    ChangeRow,
    GroupRow,
    InstanceRow,
    JobRow,
    NodeRow,
    ReservationRow,
    UserRow,
)

JOB, QUOTA, NODES = "job", "quota", "nodes"
"""What a change row says changed: a job (its row, instances or reservations), quotas, or nodes."""

_PENDING = "hai_changes"
_ORDER_LOCK_KEY = 0x4841_4943  # "HAIC": commits of change rows one at a time on PostgreSQL

Change = tuple[str, int | None]


def track(factory: sessionmaker[Session], postgres: bool) -> None:
    """Record the changes of every transaction of `factory`'s sessions.

    On PostgreSQL ids are handed out before commit, so a reader could see id 11 before id 10
    commits and skip 10 for ever; an advisory lock held from the insert to the commit keeps ids in
    commit order. SQLite writers are one at a time already.
    """

    def record(session: Session) -> None:
        session.flush()
        pending: set[Change] | None = session.info.pop(_PENDING, None)
        if not pending:
            return
        if postgres:
            session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ORDER_LOCK_KEY})
        now = time.time()
        ordered = sorted(pending, key=lambda c: (c[0], c[1] or 0))
        session.execute(insert(ChangeRow), [{"kind": k, "job_id": j, "at": now} for k, j in ordered])

    event.listen(factory, "after_flush", _collect)
    event.listen(factory, "before_commit", record)
    event.listen(factory, "after_soft_rollback", _forget)


def _collect(session: Session, _context: Any) -> None:
    pending: set[Change] = session.info.setdefault(_PENDING, set())
    for obj in chain(session.new, session.dirty, session.deleted):
        if isinstance(obj, JobRow):
            pending.add((JOB, obj.id))
        elif isinstance(obj, InstanceRow | ReservationRow):
            pending.add((JOB, obj.job_id))
        elif isinstance(obj, GroupRow | UserRow):
            pending.add((QUOTA, None))
        elif isinstance(obj, NodeRow):
            pending.add((NODES, None))


def _forget(session: Session, _previous: Any) -> None:
    session.info.pop(_PENDING, None)


def job_changed(session: Session, job_id: int) -> None:
    """Record a change the session's flushes cannot see (a Core UPDATE or DELETE touching a job)."""
    session.info.setdefault(_PENDING, set()).add((JOB, job_id))


def since(session: Session, last: int) -> Sequence[ChangeRow]:
    """The changes committed after change `last`, oldest first."""
    return session.scalars(select(ChangeRow).where(ChangeRow.id > last).order_by(ChangeRow.id)).all()


def newest(session: Session) -> int:
    """The id of the newest change (0 when there is none)."""
    return session.scalar(select(func.max(ChangeRow.id))) or 0


def trim(session: Session, before: float) -> None:
    """Forget changes recorded before `before` (a controller taking over reads the store whole)."""
    session.execute(delete(ChangeRow).where(ChangeRow.at < before))
