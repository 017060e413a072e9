"""The change feed's order: a reader never passes a change that can still commit before it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hai_airflow.server import changes
from hai_airflow.server.store import Store
from hai_airflow.server.tables import JobRow
from tests.server.test_submission import _row
from tests.support import postgres


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    store = Store(db_url)
    store.migrate()
    yield store
    store.dispose()


def _job(user: str) -> JobRow:
    return _row("PENDING", False, False, (user, "vision"), 1)


def _fed(store: Store, after: changes.Cursor) -> list[int | None]:
    with store.read() as s:
        return [c.job_id for c in changes.since(s, after)]


def test_the_feed_names_each_written_job_once_in_commit_order(store: Store) -> None:
    with store.read() as s:
        start = changes.newest(s)
    ids = []
    for user in ("alice", "bob", "dave"):
        with store.write() as s:
            job = _job(user)
            s.add(job)
            s.flush()
            ids.append(job.id)
    assert _fed(store, start) == ids
    with store.read() as s:
        last = changes.newest(s)
        assert changes.cursor(changes.since(s, start)[-1]) == last
    assert _fed(store, last) == []


def test_a_change_is_held_back_while_an_older_transaction_runs(pg_database: str) -> None:
    """PostgreSQL writers do not take turns: the later transaction commits first. A reader then sees
    neither change until the earlier one ends, and afterwards both, the earlier first, though its row
    came second; reading on from the later one's change would have skipped the earlier for ever."""
    postgres.reset_database(pg_database)
    store = Store(pg_database)
    store.migrate()
    try:
        with store.read() as s:
            start = changes.newest(s)
        with store.write() as early:
            first = _job("alice")
            early.add(first)
            early.flush()  # the transaction has its id from its first write
            with store.write() as late:
                second = _job("bob")
                late.add(second)
            assert _fed(store, start) == []
            with store.read() as s:
                assert changes.newest(s) == start
        assert _fed(store, start) == [first.id, second.id]
        with store.read() as s:
            rows = changes.since(s, start)
        assert rows[0].id > rows[1].id  # feed order is transaction order, not id order
        assert _fed(store, changes.cursor(rows[1])) == []
    finally:
        store.dispose()
