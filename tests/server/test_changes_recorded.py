"""Every Core UPDATE or DELETE of a job's row, instances or reservations says first which jobs it
changes (`changes.jobs_changed`): a forgotten call fails a test (this check, which `test_follow`'s
random runs keep open over every write path), not the resync five minutes later."""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import delete, event, select, update
from sqlalchemy.orm import ORMExecuteState, Session

from hai_airflow.server.store import changes
from hai_airflow.server.store.tables import InstanceRow, JobRow, ReservationRow
from tests.server.conftest import Api

WATCHED = {
    JobRow.__tablename__: JobRow.id,
    InstanceRow.__tablename__: InstanceRow.job_id,
    ReservationRow.__tablename__: ReservationRow.job_id,
}
"""The tables whose changes are a job's, and the column naming the job."""


@contextmanager
def unsaid_writes() -> Iterator[list[str]]:
    """While open: each statement that changed jobs it had not said it would, with where it ran
    (collected, not raised, so that no handler in between can swallow it)."""
    found: list[str] = []

    def check(state: ORMExecuteState) -> None:
        if not (state.is_update or state.is_delete):
            return
        statement = state.statement
        job = WATCHED.get(statement.table.name)  # type: ignore[attr-defined]
        if job is None:
            return
        where = statement.whereclause  # type: ignore[attr-defined]
        with state.session.no_autoflush:
            ids = set(state.session.scalars(select(job).where(where) if where is not None else select(job)))
        missing = ids - changes.said(state.session)
        if missing:
            where_from = "".join(traceback.format_stack()[-8:])
            found.append(f"jobs {sorted(missing)} changed unsaid by\n{where_from}")

    event.listen(Session, "do_orm_execute", check)
    try:
        yield found
    finally:
        event.remove(Session, "do_orm_execute", check)


def test_a_bare_update_is_caught_and_one_said_first_is_not(api: Api) -> None:
    """The check itself (every write path runs under it in `test_follow`'s random runs)."""
    job = api.submit("alice", cmd="sleep 30")
    with unsaid_writes() as unsaid:
        with api.ctx.store.write() as s:
            s.execute(update(JobRow).where(JobRow.id == job["id"]).values(reason="set unsaid"))
        assert len(unsaid) == 1 and f"jobs [{job['id']}]" in unsaid[0]
        with api.ctx.store.write() as s:
            changes.jobs_changed(s, [job["id"]])
            s.execute(update(JobRow).where(JobRow.id == job["id"]).values(reason="set as said"))
            s.execute(delete(ReservationRow).where(ReservationRow.job_id == job["id"]))
        assert len(unsaid) == 1
        with api.ctx.store.write() as s:  # what a transaction said ends with it
            s.execute(update(JobRow).where(JobRow.id == job["id"]).values(reason="unsaid again"))
        assert len(unsaid) == 2
