"""Table tests of `plan` on drained nodes: no new placement there, no victims looked for there, and a
job that could run only there says so."""

from __future__ import annotations

import pytest

from hai_airflow.scheduling import plan
from hai_airflow.scheduling.model import Admit, Decision, Reservation, Reserve, Snapshot, Suspend, Wait
from hai_airflow.scheduling.state import ClusterState

from .builders import T0, JobBuilder, job, node, snapshot, wp

LONGEST = "the longest-running low-priority job whose suspension makes room"
NO_VICTIM = "suspending running low-priority jobs would not make room"
FULL = "needs 8xV100 on one node; largest free block is 0"
ALL8 = tuple(range(8))


def full_node(job_id: int, name: str, since: float) -> JobBuilder:
    return job(job_id).low().gpus(8).running_since(since).on(name)


CASES = [
    pytest.param(
        snapshot([node("n1", drained=True), node("n2")], [job(1).gpus(4)]),
        [Admit(1, (wp("n2", 0, 1, 2, 3),), False, "starts on n2 GPUs 0-3")],
        id="a new job goes past the drained node it would have taken",
    ),
    pytest.param(
        snapshot([node("n1", drained=True), node("n2")], [full_node(11, "n2", T0 - 60), job(1).gpus(8)]),
        [Wait(1, f"{FULL}; node n1 has room but is drained", 1)],
        id="a job that fits only on a drained node waits, and says so",
    ),
    pytest.param(
        snapshot([node("n1", drained=True), node("n2", drained=True)], [job(1).gpus(8)]),
        [Wait(1, f"{FULL}; nodes n1,n2 have room but are drained", 1)],
        id="every node drained: the job waits, never rejected",
    ),
    pytest.param(
        snapshot([node("n1", drained=True)], [job(1).gpus(8).suspended(since=T0 - 30)]),
        [Wait(1, f"{FULL}; node n1 has room but is drained", 1)],
        id="a suspended job does not resume on a drained node",
    ),
    pytest.param(
        snapshot([node("n1", drained=True), node("n2")], [job(1).cpu_only(4, 16)]),
        [Admit(1, (wp("n2", cpus=4, memory_gb=16),), False, "starts on n2")],
        id="a CPU job does not go on a drained node either",
    ),
    pytest.param(
        snapshot([node("n1"), node("n2", drained=True), node("n3")], [job(1).gpus(8).workers(2)]),
        [Admit(1, (wp("n1", *ALL8), wp("n3", *ALL8)), False, "starts on n1 GPUs 0-7, n3 GPUs 0-7")],
        id="a gang leaves the drained node out",
    ),
    pytest.param(
        snapshot([node("n1", drained=True), node("n2")], [
            full_node(11, "n1", T0 - 900), full_node(12, "n2", T0 - 100), job(1).high().gpus(8),
        ]),
        [
            Suspend(12, 1, f"suspended so high-priority job 1 can run ({LONGEST})"),
            Reserve(1, (wp("n2", *ALL8),), "GPUs freed by suspending job 12 are held for job 1: n2 GPUs 0-7"),
            Wait(1, "waiting for job 12 to suspend", 1, 12),
        ],
        id="victims are looked for off the drained node, whose longer-running job runs on",
    ),
    pytest.param(
        snapshot([node("n1", drained=True)], [full_node(11, "n1", T0 - 900), job(1).high().gpus(8)]),
        [Wait(1, f"{FULL}; {NO_VICTIM}", 1)],
        id="a high job suspends nobody on a drained node and keeps no guard there",
    ),
    pytest.param(
        snapshot(
            [node("n1", drained=True), node("n2")],
            [job(1).high().gpus(8).suspended(since=T0 - 5)],
            reservations=(Reservation(1, "n1", ALL8),),
        ),
        [Admit(1, (wp("n2", *ALL8),), True, "resumes on n2 GPUs 0-7")],
        id="GPUs reserved on a node drained since are not used; the job goes elsewhere",
    ),
]


@pytest.mark.parametrize(("snap", "expected"), CASES)
def test_plan_on_drained_nodes(snap: Snapshot, expected: list[Decision]) -> None:
    assert plan(snap, T0) == expected


def test_a_drain_reaches_the_kept_state_as_one_event_and_the_next_plan() -> None:
    """Draining is a `nodes_changed` event: counted (so a settled cluster plans again), and the usage
    recounted over the new nodes gives what a fresh load gives."""
    running = full_node(11, "n1", T0 - 60).build()
    waiting = job(1).gpus(4).build()
    state = ClusterState.load([node("n1"), node("n2")], [running, waiting])
    assert plan(state.snapshot(), T0, state.usage)[0] == Admit(1, (wp("n2", 0, 1, 2, 3),), False,
                                                               "starts on n2 GPUs 0-3")
    events = state.events
    state.nodes_changed([node("n1"), node("n2", drained=True)])
    assert state.events == events + 1
    state.nodes_changed([node("n1"), node("n2", drained=True)])
    assert state.events == events + 1, "the same nodes again change nothing"
    fresh = ClusterState.load([node("n1"), node("n2", drained=True)], [running, waiting])
    assert state.usage.free == fresh.usage.free and state.usage.buckets == fresh.usage.buckets
    assert plan(state.snapshot(), T0, state.usage) == [
        Wait(1, "needs 4xV100 on one node; largest free block is 0; node n2 has room but is drained", 1)
    ]
