"""The forward run behind forecasts: the planner over a copy of the cluster with estimated runtimes."""

from __future__ import annotations

from itertools import count

from hai_airflow.scheduling import plan
from hai_airflow.scheduling.model import Job, Reservation, Snapshot, WorkerPlacement
from hai_airflow.sim.forecast import STEP_SECONDS, forecast
from hai_airflow.spec import JobState
from tests.scheduling.builders import T0, job, node, snapshot


def test_queued_jobs_start_as_the_jobs_ahead_end() -> None:
    snap = snapshot([node("n1")], [
        job(1).low().gpus(8).running_since(T0 - 600).on("n1"),
        job(2).low().gpus(8).submitted(T0 - 300),
        job(3).low().gpus(8).submitted(T0 - 100),
    ])
    result = forecast(snap, {1: 600.0, 2: 1200.0, 3: 60.0}, T0)
    assert result.starts == {2: T0 + 600, 3: T0 + 1800}
    assert result.freed_by == {2: 1, 3: 2}
    assert result.complete and result.suspensions == {}


def test_close_ends_are_planned_together_from_the_last_of_them() -> None:
    """Ends less than a step apart make one plan, at the last end (what both freed is free then)."""
    snap = snapshot([node("n1")], [
        job(1).low().gpus(4).running_since(T0 - 600).on("n1"),
        job(2).low().gpus(4).running_since(T0 - 600).on("n1", first=4),
        job(3).low().gpus(8),
    ])
    result = forecast(snap, {1: 600.0, 2: 600.0 + STEP_SECONDS / 2, 3: 60.0}, T0)
    assert result.starts == {3: T0 + 600 + STEP_SECONDS / 2}
    assert result.freed_by == {3: 2}


def test_a_high_job_suspends_a_running_low_job_before_its_end() -> None:
    snap = snapshot([node("n1")], [
        job(1).low().gpus(8).running_since(T0 - 600).on("n1"),
        job(2).high().gpus(8),
    ])
    result = forecast(snap, {1: 3600.0, 2: 600.0}, T0)
    assert result.suspensions == {1: T0}
    assert result.starts == {2: T0, 1: T0 + 600}  # the low job resumes when the high one ends
    assert result.freed_by == {1: 2}


def test_the_snapshot_is_left_as_it_was() -> None:
    snap = snapshot([node("n1")], [
        job(1).low().gpus(8).running_since(T0 - 600).on("n1"),
        job(2).high().gpus(8),
    ])
    before = (snap, plan(snap, T0))
    forecast(snap, {1: 3600.0, 2: 600.0}, T0)
    assert (snap, plan(snap, T0)) == before


def test_a_job_that_can_never_start_has_no_start_and_the_run_ends() -> None:
    snap = snapshot([node("n1")], [job(1).low().gpus(8).workers(2)])
    result = forecast(snap, {1: 60.0}, T0)
    assert result.starts == {} and result.complete


def test_the_time_budget_cuts_the_run_short() -> None:
    snap = snapshot([node("n1")], [
        job(1).low().gpus(8).running_since(T0 - 600).on("n1"),
        job(2).low().gpus(8),
        job(3).low().gpus(8),
    ])
    ticks = count()
    result = forecast(snap, {1: 600.0, 2: 600.0, 3: 600.0}, T0, budget_seconds=2.5,
                      clock=lambda: float(next(ticks)))
    assert not result.complete
    assert result.starts == {2: T0 + 600}  # two plans before the budget ran out: at T0 and T0 + 600
    assert result.horizon == T0 + 1200


def test_a_high_job_starts_at_once_on_what_shrinking_a_resizable_job_frees() -> None:
    four = tuple(WorkerPlacement(n, tuple(range(first, first + 4))) for n in ("n1", "n2") for first in (0, 4))
    resizable = Job(1, "u", "g", JobState.RUNNING, 0, T0 - 900, workers=4, gpus_per_worker=4,
                    started_at=T0 - 600, placement=four, elastic=True, min_workers=2, max_workers=4)
    high = Job(2, "u", "g", JobState.PENDING, 4, T0 - 10, workers=1, gpus_per_worker=8)
    snap = Snapshot((node("n1"), node("n2")), (resizable, high))

    result = forecast(snap, {1: 3600.0, 2: 600.0}, T0)

    assert result.starts == {2: T0}
    assert result.suspensions == {}  # shrunk, not suspended: it runs on at half its workers


def test_a_job_stopping_to_shrink_restarts_on_its_reservation_and_is_not_a_suspension() -> None:
    four = tuple(WorkerPlacement(n, tuple(range(first, first + 4))) for n in ("n1", "n2") for first in (0, 4))
    shrinking = Job(1, "u", "g", JobState.SUSPENDING, 0, T0 - 900, workers=2, gpus_per_worker=4,
                    started_at=T0 - 600, placement=four, elastic=True, min_workers=2, max_workers=4)
    high = Job(2, "u", "g", JobState.PENDING, 4, T0 - 10, workers=1, gpus_per_worker=8)
    held = (Reservation(1, "n1", (0, 1, 2, 3)), Reservation(1, "n1", (4, 5, 6, 7)),
            Reservation(2, "n2", tuple(range(8))))
    snap = Snapshot((node("n1"), node("n2")), (shrinking, high), reservations=held)

    result = forecast(snap, {1: 1000.0, 2: 600.0}, T0)

    assert result.starts == {1: T0, 2: T0}
    assert result.suspensions == {}
