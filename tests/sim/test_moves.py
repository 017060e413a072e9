"""The simulator moves jobs through the server's table of states (`spec.MOVES`): every move it makes is
one the server makes, and a move the table does not list raises."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sim_builders import job, node, trace

from hai_airflow.scheduling.model import Admit, Decision, Shrink, Snapshot, Suspend, WorkerPlacement
from hai_airflow.sim import engine as engine_module
from hai_airflow.sim import simulate
from hai_airflow.spec import IllegalMove, JobState

P, ST, R, SG, SD, OK = (
    JobState.PENDING,
    JobState.STARTING,
    JobState.RUNNING,
    JobState.SUSPENDING,
    JobState.SUSPENDED,
    JobState.SUCCEEDED,
)
# One 8-GPU node; a low job runs 0..10000 s, a high job arrives at 4000 s for 1000 s.
LOW_THEN_HIGH = trace(
    [node("n1")],
    [job(1).low().gpus(8).at(0).lasting(10_000), job(2).high(4).gpus(8).at(4000).lasting(1000)],
)
WHOLE_NODE = (WorkerPlacement("n1", tuple(range(8))),)


def test_a_suspended_job_walks_the_servers_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    walked: dict[int, list[JobState]] = {}
    checked = engine_module.checked_move

    def recorded(job_id: int, from_state: JobState, to_state: JobState, kind: str) -> JobState:
        walked.setdefault(job_id, [from_state]).append(to_state)
        return checked(job_id, from_state, to_state, kind)

    monkeypatch.setattr(engine_module, "checked_move", recorded)
    simulate(LOW_THEN_HIGH, "seed", checkpoint_interval=1800, suspend_delay=60)

    assert walked == {1: [P, ST, R, SG, SD, ST, R, OK], 2: [P, ST, R, OK]}


def _plan(decide: Callable[[Snapshot, float], list[Decision]]) -> Callable[..., list[Decision]]:
    def plan(snapshot: Snapshot, now: float, usage: object = None) -> list[Decision]:
        return decide(snapshot, now)

    return plan


def _suspends_waiting(snapshot: Snapshot, now: float) -> list[Decision]:
    return [Suspend(j.id, 2, "test") for j in snapshot.jobs if j.state == JobState.PENDING]


def _admits_twice(snapshot: Snapshot, now: float) -> list[Decision]:
    return [Admit(1, WHOLE_NODE, False, "test")] if now in (0, 4000) else []


def _shrinks_waiting(snapshot: Snapshot, now: float) -> list[Decision]:
    return [Shrink(j.id, 1, WHOLE_NODE, 2, "test") for j in snapshot.jobs if j.state == JobState.PENDING]


@pytest.mark.parametrize(
    ("decide", "move"),
    [
        pytest.param(_suspends_waiting, "PENDING -> SUSPENDING", id="suspending a job that waits"),
        pytest.param(_admits_twice, "RUNNING -> STARTING", id="admitting a job that runs"),
        pytest.param(_shrinks_waiting, "PENDING -> SUSPENDING", id="resizing a job that waits"),
    ],
)
def test_a_move_the_table_does_not_list_stops_the_simulation(
    monkeypatch: pytest.MonkeyPatch, decide: Callable[[Snapshot, float], list[Decision]], move: str
) -> None:
    monkeypatch.setattr(engine_module, "plan", _plan(decide))

    with pytest.raises(IllegalMove, match=f"job 1: {move} "):
        simulate(LOW_THEN_HIGH, "seed")
