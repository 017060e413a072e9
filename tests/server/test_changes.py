"""The change feed's order: a reader never passes a change that can still commit before it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from hai_airflow.server.store import changes
from hai_airflow.server.store.database import Store
from hai_airflow.server.store.tables import JobRow
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


@pytest.fixture
def pg_store(pg_database: str) -> Iterator[Store]:
    postgres.reset_database(pg_database)
    store = Store(pg_database)
    store.migrate()
    yield store
    store.dispose()


@contextmanager
def overtaken(store: Store) -> Iterator[tuple[JobRow, JobRow]]:
    """Two jobs written by two transactions: the later one commits while the earlier one, which
    already has its transaction id, is still open (until the block ends)."""
    with store.write() as early:
        first = _job("alice")
        early.add(first)
        early.flush()  # the transaction has its id from its first write
        with store.write() as late:
            second = _job("bob")
            late.add(second)
        yield first, second


def test_a_change_is_held_back_while_an_older_transaction_runs(pg_store: Store) -> None:
    """PostgreSQL writers do not take turns: the later transaction commits first. A reader then sees
    neither change until the earlier one ends, and afterwards both, the earlier first, though its row
    came second; reading on from the later one's change would have skipped the earlier for ever."""
    with pg_store.read() as s:
        start = changes.newest(s)
    with overtaken(pg_store) as (first, second):
        assert _fed(pg_store, start) == []
        with pg_store.read() as s:
            assert changes.newest(s) == start
    assert _fed(pg_store, start) == [first.id, second.id]
    with pg_store.read() as s:
        rows = changes.since(s, start)
    assert rows[0].id > rows[1].id  # feed order is transaction order, not id order
    assert _fed(pg_store, changes.cursor(rows[1])) == []


def test_a_change_held_back_too_long_is_taken_anyway(pg_store: Store) -> None:
    """A transaction left open (here, or in any database of the same server) holds the feed back for
    HELD_BACK_SECONDS at most; then the reader takes what committed behind it."""
    with pg_store.read() as s:
        start = changes.newest(s)
    with overtaken(pg_store) as (_, second):
        later = time.time() + changes.HELD_BACK_SECONDS + 1
        with pg_store.read() as s:
            assert [c.job_id for c in changes.since(s, start)] == []
            taken = changes.since(s, start, now=later)
            assert [c.job_id for c in taken] == [second.id]
            assert changes.newest(s, now=later) == changes.cursor(taken[0])
