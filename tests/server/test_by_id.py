"""Reads by id past one IN list (`in_lists.CHUNK` ids), on both stores."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hai_airflow.server.config import parse_config
from hai_airflow.server.jobs.snapshot import current_instances, reservations_of
from hai_airflow.server.provision import apply_config
from hai_airflow.server.store import in_lists
from hai_airflow.server.store.database import Store
from hai_airflow.server.store.tables import InstanceRow, JobRow, ReservationRow
from tests.server.test_submission import _row
from tests.support.live_server import TEST_CONFIG

MANY = in_lists.CHUNK * 2 + 1


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    store = Store(db_url)
    store.migrate()
    config = parse_config(TEST_CONFIG)
    apply_config(store, config, list(config.nodes))
    yield store
    store.dispose()


def _jobs(store: Store, count: int) -> list[int]:
    with store.write() as s:
        rows = [_row("PENDING", False, False, ("alice", "vision"), 1) for _ in range(count)]
        s.add_all(rows)
        s.flush()
        return [r.id for r in rows]


def test_chunks_keep_every_id_in_order_and_none_is_too_long() -> None:
    parts = list(in_lists.chunks(range(MANY)))
    assert [i for part in parts for i in part] == list(range(MANY))
    assert max(len(part) for part in parts) == in_lists.CHUNK
    assert list(in_lists.chunks([])) == []


def test_rows_finds_every_named_row_and_no_other(store: Store) -> None:
    ids = _jobs(store, MANY)
    with store.read() as s:
        found = in_lists.rows(s, JobRow, [*ids[1:], 10**9])
    assert sorted(found) == ids[1:]
    assert all(found[i].id == i for i in ids[1:])


def test_instances_and_reservations_of_many_jobs(store: Store) -> None:
    """Reservations come back oldest first even when the oldest belong to jobs in a later chunk."""
    ids = _jobs(store, MANY)
    with store.write() as s:
        for job_id in ids:
            s.add(InstanceRow(job_id=job_id, created_at=0.0, log_path="", work_dir="", model_dir=""))
        for job_id in reversed(ids):
            s.add(ReservationRow(job_id=job_id, node="node1", gpus="[0]", created_at=0.0))
    asked = ids[1:]
    with store.read() as s:
        current = current_instances(s, asked)
        reserved = reservations_of(s, asked)
    assert sorted(current) == asked
    assert all(current[i].job_id == i for i in asked)
    assert [r.job_id for r in reserved] == list(reversed(asked))
