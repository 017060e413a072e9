"""The job state machine: every move `spec.MOVES` lists is written with its event, every other is
refused before anything is written; and the controller's own moves are all in the table."""

from __future__ import annotations

import itertools
import typing
from pathlib import Path

import pytest
from sqlalchemy import select

from hai_airflow.backends.common.base import Exit
from hai_airflow.server.jobs import transitions
from hai_airflow.server.store.database import Store
from hai_airflow.server.store.tables import EventRow, InstanceRow, JobRow
from hai_airflow.spec import MOVES, TERMINAL_STATES, JobState
from tests.server.test_submission import _row

STATES = tuple(JobState)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> typing.Iterator[Store]:
    store = Store(f"sqlite:///{Path(tmp_path_factory.mktemp('moves')) / 'hai.db'}")
    store.migrate()
    yield store
    store.dispose()


def job_in(store: Store, state: str) -> int:
    with store.write() as s:
        row = _row(state, False, False, ("alice", "vision"), 1)
        s.add(row)
        s.flush()
        return row.id


@pytest.mark.parametrize(("from_state", "to_state"), sorted(MOVES))
def test_every_listed_move_is_written_with_its_event(store: Store, from_state: str, to_state: str) -> None:
    job_id = job_in(store, from_state)
    with store.write() as s:
        job = s.get(JobRow, job_id)
        assert job is not None
        transitions.move(s, job, to_state, "test", MOVES[from_state, to_state], 1.0)
    with store.read() as s:
        job = s.get(JobRow, job_id)
        assert job is not None and job.state == to_state
        (event,) = s.scalars(select(EventRow).where(EventRow.job_id == job_id)).all()
        assert (event.from_state, event.to_state) == (from_state, to_state)
        assert (job.ended_at is not None) == (to_state in TERMINAL_STATES)


ILLEGAL = [pair for pair in itertools.product(STATES, STATES) if pair not in MOVES]


@pytest.mark.parametrize(("from_state", "to_state"), ILLEGAL)
def test_every_other_move_is_refused_and_nothing_is_written(
    store: Store, from_state: str, to_state: str
) -> None:
    job_id = job_in(store, from_state)
    with pytest.raises(transitions.IllegalMove, match=f"{from_state} -> {to_state}"), store.write() as s:
        job = s.get(JobRow, job_id)
        assert job is not None
        transitions.move(s, job, to_state, "test", "no such move", 1.0)
    with store.read() as s:
        job = s.get(JobRow, job_id)
        assert job is not None and job.state == from_state
        assert s.scalars(select(EventRow).where(EventRow.job_id == job_id)).all() == []


def test_the_table_is_the_whole_machine() -> None:
    """Final states go nowhere; every other state is reachable from PENDING and can end."""
    assert not [m for m in MOVES if m[0] in TERMINAL_STATES]
    reached, todo = {"PENDING"}, ["PENDING"]
    while todo:
        here = todo.pop()
        for a, b in MOVES:
            if a == here and b not in reached:
                reached.add(b)
                todo.append(b)
    assert reached == set(STATES)
    assert len(ILLEGAL) + len(MOVES) == len(STATES) ** 2


@pytest.mark.parametrize("bogus", ["LOST", "running", ""])
def test_the_state_column_refuses_what_is_not_a_state(store: Store, bogus: str) -> None:
    """The ORM column is typed: a string that is not a `JobState` is never written."""
    job_id = job_in(store, "PENDING")
    with pytest.raises(Exception, match=f"{bogus!r} is not a job state"), store.write() as s:
        job = s.get(JobRow, job_id)
        assert job is not None
        job.state = bogus  # type: ignore[assignment]
    with store.read() as s:
        job = s.get(JobRow, job_id)
        assert job is not None and job.state is JobState.PENDING


def test_an_exit_of_a_job_whose_start_went_unrecorded_records_the_start_first(store: Store) -> None:
    """The store failed between a launch and the write of its start; the instance ran and ended."""
    job_id = job_in(store, JobState.STARTING)
    with store.write() as s:
        job = s.get(JobRow, job_id)
        assert job is not None
        inst = InstanceRow(
            job_id=job_id,
            created_at=5.0,
            placement="[]",
            log_path="",
            work_dir="",
            model_dir="",
            grace_seconds=0,
        )
        s.add(inst)
        s.flush()
        job.current_instance_id = inst.id
        ex = Exit(instance_id=inst.id, exit_code=0, reason="exit code 0")
        transitions.instance_ended(s, job, inst, ex, transitions.exit_outcome(job, inst, ex), 9.0)
    with store.read() as s:
        job = s.get(JobRow, job_id)
        assert job is not None and job.state == JobState.SUCCEEDED and job.runtime_seconds == 4.0
        moves = [
            (e.from_state, e.to_state) for e in s.scalars(select(EventRow).where(EventRow.job_id == job_id))
        ]
        assert moves == [(JobState.STARTING, JobState.RUNNING), (JobState.RUNNING, JobState.SUCCEEDED)]
