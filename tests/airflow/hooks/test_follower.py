"""The job follower's decisions, state in, outcome out: what ends a wait and what the end means to a
task. The live runs of the operators (blocking and deferred) and the trigger follow jobs with them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hai_airflow.hooks.follower import (
    SUSPENSION,
    HaiJobEvent,
    Look,
    event_status,
    failure_message,
    look,
    verdict,
)
from hai_airflow.spec import JobState, JobView

S = JobState


def job(state: JobState, reason: str | None = None) -> JobView:
    return JobView(
        id=7, mode="cpu", state=state, priority="low", max_schedule=0, gpus=0, gpu_type=None, workers=1,
        submitted_at=datetime(2026, 1, 1, tzinfo=UTC), task_name="t", user="alice", group="vision", spec={},
        reason=reason, instances=2, preemptions=1,
    )  # fmt: skip


OPERATOR = (S.SUCCEEDED,)
"""What an operator's task waits for: the trigger's own targets are none, any end is done."""


@pytest.mark.parametrize(
    ("state", "targets", "done", "ask_forecast"),
    [
        pytest.param(S.PENDING, (), False, True, id="queued: wait, tell the forecast"),
        pytest.param(S.STARTING, (), False, False, id="starting: wait"),
        pytest.param(S.RUNNING, (), False, False, id="running: wait"),
        pytest.param(S.SUSPENDING, (), False, False, id="suspending: wait through"),
        pytest.param(S.SUSPENDED, (), False, True, id="suspended: wait through, tell the forecast"),
        pytest.param(S.RUNNING, (S.RUNNING,), True, False, id="a target state ends the wait"),
        pytest.param(S.SUCCEEDED, (), True, False, id="succeeded ends the wait"),
        pytest.param(S.FAILED, (S.RUNNING,), True, False, id="an end before the target ends the wait"),
        pytest.param(S.CANCELLED, (), True, False, id="cancelled ends the wait"),
        pytest.param(S.TIMEOUT, (), True, False, id="timed out ends the wait"),
    ],
)
def test_look_says_what_ends_the_wait(
    state: JobState, targets: tuple[str, ...], done: bool, ask_forecast: bool
) -> None:
    assert look(job(state), None, targets) == Look(
        line=f"hai job 7 is {state}" + (SUSPENDED if state in SUSPENSION else ""),
        done=done,
        ask_forecast=ask_forecast,
    )


SUSPENDED = "; the task keeps waiting for it to resume and end"


def test_look_logs_a_state_once() -> None:
    assert look(job(S.PENDING), None, ()).line == "hai job 7 is PENDING"
    assert look(job(S.PENDING), S.PENDING, ()).line is None
    assert (
        look(job(S.FAILED, "exit code 3"), S.RUNNING, ()).line == "hai job 7: RUNNING -> FAILED (exit code 3)"
    )


@pytest.mark.parametrize(
    ("state", "targets", "status", "outcome"),
    [
        pytest.param(S.SUCCEEDED, OPERATOR, "success", "reached", id="succeeded: the operator succeeds"),
        pytest.param(S.FAILED, OPERATOR, "failed", "failed", id="failed: the operator fails"),
        pytest.param(S.CANCELLED, OPERATOR, "cancelled", "failed", id="cancelled: the operator fails"),
        pytest.param(S.TIMEOUT, OPERATOR, "timeout", "failed", id="timed out: the operator fails"),
        pytest.param(S.RUNNING, (S.RUNNING,), "reached", "reached", id="a sensor's target state"),
        pytest.param(S.FAILED, (S.FAILED,), "failed", "reached", id="a sensor waiting for a failure"),
        pytest.param(S.SUCCEEDED, (S.RUNNING,), "success", "failed", id="ended past a sensor's target"),
    ],
)
def test_an_end_maps_to_one_task_outcome(
    state: JobState, targets: tuple[str, ...], status: str, outcome: str
) -> None:
    event = HaiJobEvent.from_job(job(state), targets)
    assert (event.status, verdict(event, targets)) == (status, outcome)


def test_a_suspended_job_keeps_the_task_waiting() -> None:
    event = HaiJobEvent(status="reached", job_id=7, state=S.SUSPENDED)
    assert verdict(event, (S.RUNNING,)) == "waiting"


def test_a_state_neither_final_nor_asked_for_is_no_event() -> None:
    with pytest.raises(ValueError, match="neither final nor one of"):
        event_status(S.RUNNING, ())


def test_a_lost_job_fails_the_task_saying_so() -> None:
    event = HaiJobEvent.lost(7, "job 7 not found")
    assert verdict(event, OPERATOR) == "failed"
    assert failure_message(event) == "lost track of hai job 7: job 7 not found"


def test_the_failure_names_the_end_its_reason_and_the_log_tail() -> None:
    event = HaiJobEvent.from_job(job(S.FAILED, "exit code 3"), (), ["loading", "CUDA error"])
    assert failure_message(event) == (
        "hai job 7 ended FAILED: exit code 3\nlast log lines:\nloading\nCUDA error"
    )
    assert failure_message(HaiJobEvent.from_job(job(S.CANCELLED), ())) == "hai job 7 ended CANCELLED"
