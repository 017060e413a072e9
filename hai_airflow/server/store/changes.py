"""The change feed: each write transaction records which jobs it changed (and whether quotas or
nodes changed), so the controller keeps its cluster state without re-reading the store.

A job's change enters the feed one way: `jobs_changed`. A flush calls it for the ORM rows it writes,
so no ORM writer can forget it; a write the flushes cannot see (a Core UPDATE or DELETE of a job's
row, instances or reservations) calls it first, as `transitions.move` does. A Core statement that did
not is caught by a test (`test_changes_recorded`, kept open over `test_follow`'s random writes), not
by the resync.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import chain
from typing import Any

from sqlalchemy import ColumnElement, delete, event, func, insert, or_, select, text, tuple_
from sqlalchemy.orm import Session, sessionmaker

from hai_airflow.server.store import clock
from hai_airflow.server.store.tables import (
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
_RECORDED = "hai_changes_recorded"
_SAID = "hai_changes_said"

Change = tuple[str, int | None]
Cursor = tuple[int, int]
"""Where a reader of the feed stands: the (transaction, id) of the newest change it applied."""
START: Cursor = (0, 0)

# PostgreSQL hands ids out before commit, so a reader could see id 11 before id 10 commits and skip 10
# for ever. Each row carries its transaction's id instead, and a reader takes only the rows of
# transactions older than every one still running (its snapshot's xmin), in (transaction, id) order:
# no row can join those any more, so none is skipped and writers need not take turns.
_THIS_TRANSACTION = text("pg_current_xact_id()::text::bigint")
_RUNNING_FROM = text("pg_snapshot_xmin(pg_current_snapshot())::text::bigint")

HELD_BACK_SECONDS = 30.0
"""A change committed this long ago is taken even while an older transaction still runs. Transaction
ids are shared by every database of a PostgreSQL server, so a transaction left open anywhere on it
would otherwise hold the feed back until it ends. What that transaction changes, if it commits later,
is behind the reader by then: the controller's full read of the store (every few minutes) applies it."""


def track(
    factory: sessionmaker[Session], postgres: bool, committed: Callable[[], None] | None = None
) -> None:
    """Record the changes of every transaction of `factory`'s sessions (on PostgreSQL, with the
    transaction's id); `committed` is called after each commit that recorded some."""
    statement = insert(ChangeRow).values(txn=_THIS_TRANSACTION) if postgres else insert(ChangeRow)

    def record(session: Session) -> None:
        session.flush()
        session.info.pop(_SAID, None)
        pending: set[Change] | None = session.info.pop(_PENDING, None)
        if not pending:
            return
        now = clock.now()
        ordered = sorted(pending, key=lambda c: (c[0], c[1] or 0))
        session.execute(statement, [{"kind": k, "job_id": j, "at": now} for k, j in ordered])
        session.info[_RECORDED] = True

    event.listen(factory, "after_flush", _collect)
    event.listen(factory, "before_commit", record)
    event.listen(factory, "after_soft_rollback", _forget)
    if committed is not None:

        def after_commit(session: Session) -> None:
            if session.info.pop(_RECORDED, False):
                committed()

        event.listen(factory, "after_commit", after_commit)


def _collect(session: Session, _context: Any) -> None:
    """What a flush wrote, said for it: its jobs through `jobs_changed`, like every other write."""
    jobs: set[int] = set()
    others: set[Change] = set()
    for obj in chain(session.new, session.dirty, session.deleted):
        if isinstance(obj, JobRow):
            jobs.add(obj.id)
        elif isinstance(obj, InstanceRow | ReservationRow):
            jobs.add(obj.job_id)
        elif isinstance(obj, GroupRow | UserRow):
            others.add((QUOTA, None))
        elif isinstance(obj, NodeRow):
            others.add((NODES, None))
    jobs_changed(session, jobs)
    session.info.setdefault(_PENDING, set()).update(others)


def _forget(session: Session, _previous: Any) -> None:
    session.info.pop(_PENDING, None)
    session.info.pop(_RECORDED, None)
    session.info.pop(_SAID, None)


def jobs_changed(session: Session, job_ids: Iterable[int], feed: bool = True) -> None:
    """Say, before writing them, which jobs this transaction changes (their rows, instances or
    reservations): the change feed carries them to the controller with the commit. `feed=False` for a
    change no reader of the feed needs: one the controller makes and keeps itself (a waiting reason,
    `Kept.reason_written`), or a job this transaction made and removes again."""
    ids = list(job_ids)
    session.info.setdefault(_SAID, set()).update(ids)
    if feed:
        session.info.setdefault(_PENDING, set()).update((JOB, j) for j in ids)


def said(session: Session) -> frozenset[int]:
    """The jobs this transaction said so far that it changes (`jobs_changed`)."""
    return frozenset(session.info.get(_SAID, ()))


def since(session: Session, last: Cursor, now: float | None = None) -> Sequence[ChangeRow]:
    """The changes committed after `last` that no running transaction can precede (or that were
    held back for HELD_BACK_SECONDS before `now`), in feed order."""
    if _sqlite(session):  # one writer at a time: ids are in commit order
        return session.scalars(select(ChangeRow).where(ChangeRow.id > last[1]).order_by(ChangeRow.id)).all()
    return session.scalars(
        select(ChangeRow)
        .where(tuple_(ChangeRow.txn, ChangeRow.id) > tuple_(*last), _ready(now))
        .order_by(ChangeRow.txn, ChangeRow.id)
    ).all()


def newest(session: Session, now: float | None = None) -> Cursor:
    """The newest change `since` would give (`START` when there is none)."""
    if _sqlite(session):
        return (0, session.scalar(select(func.max(ChangeRow.id))) or 0)
    row = session.execute(
        select(ChangeRow.txn, ChangeRow.id)
        .where(_ready(now))
        .order_by(ChangeRow.txn.desc(), ChangeRow.id.desc())
        .limit(1)
    ).first()
    return START if row is None else (row.txn, row.id)


def _ready(now: float | None) -> ColumnElement[bool]:
    """PostgreSQL: no running transaction can come before the change, or it waited long enough."""
    held_since = (clock.now() if now is None else now) - HELD_BACK_SECONDS
    return or_(ChangeRow.txn < _RUNNING_FROM, ChangeRow.at < held_since)


def cursor(change: ChangeRow) -> Cursor:
    return (change.txn, change.id)


def _sqlite(session: Session) -> bool:
    return session.get_bind().dialect.name == "sqlite"


def trim(session: Session, before: float) -> None:
    """Forget changes recorded before `before` (a controller taking over reads the store whole)."""
    session.execute(delete(ChangeRow).where(ChangeRow.at < before))
