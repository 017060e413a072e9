"""When the controller may skip planning: `Settled` after a plan of waits only, until the next event,
and the cluster state's event count that says whether one arrived."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hai_airflow.scheduling import plan
from hai_airflow.scheduling.model import (
    Admit,
    Decision,
    Quota,
    Reject,
    Reservation,
    Reserve,
    Snapshot,
    Suspend,
    Wait,
)
from hai_airflow.scheduling.settled import REPLAN_SECONDS, Settled
from hai_airflow.scheduling.state import ClusterState

from .builders import T0, job, node
from .test_plan_properties import snapshots


def test_a_plan_of_waits_settles_and_any_other_decision_does_not() -> None:
    waits = [Wait(1, "no room", 1), Wait(2, "no room", 2)]
    assert Settled.after(waits, 7, T0) == Settled(7, T0)
    assert Settled.after([], 7, T0) == Settled(7, T0)
    assert Settled.after([*waits, Admit(3, (), False, "fits")], 7, T0) is None


def test_settled_holds_until_an_event_or_the_replan_interval() -> None:
    settled = Settled(7, T0)
    assert settled.holds(7, T0 + REPLAN_SECONDS - 0.1)
    assert not settled.holds(8, T0 + 0.1), "an event ends it"
    assert not settled.holds(7, T0 + REPLAN_SECONDS), "time alone ends it at the interval"


def test_the_state_counts_events_that_change_something_only() -> None:
    waiting = job(1).gpus(8).build()
    state = ClusterState([node("n1")])
    state.job_changed(waiting)
    assert state.events == 1
    state.job_changed(replace(waiting))  # the same record read again (a reason was written)
    assert state.events == 1
    state.job_changed(replace(waiting, max_schedule=4))
    assert state.events == 2
    state.reserved(1, [Reservation(1, "n1", (0, 1))])
    state.reserved(1, [Reservation(1, "n1", (0, 1))])
    assert state.events == 3
    state.reservation_cleared(1)
    state.reservation_cleared(1)
    assert state.events == 4
    state.quota_changed(Quota({"vision": 8}))
    state.quota_changed(Quota({"vision": 8}))
    assert state.events == 5
    state.job_left(1)
    state.job_left(1)
    assert state.events == 6
    state.nodes_changed([node("n1"), node("n2")])
    state.nodes_changed([node("n1"), node("n2")])
    assert state.events == 7


def settle(snapshot: Snapshot, now: float) -> tuple[Snapshot, list[Decision]] | None:
    """Apply plans' decisions as the controller would (victims stay SUSPENDING, holding their GPUs)
    until a plan only makes jobs wait: a cluster the controller would call settled."""
    for _ in range(12):
        decisions = plan(snapshot, now)
        if Settled.after(decisions, 0, now) is not None:
            return snapshot, decisions
        jobs = {j.id: j for j in snapshot.jobs}
        reservations = {r.job_id: r for r in snapshot.reservations}
        held: dict[int, list[Reservation]] = {}
        for d in decisions:
            if isinstance(d, Admit):
                admitted = jobs[d.job_id]
                jobs[d.job_id] = replace(admitted, state="RUNNING", placement=d.placement, started_at=now)
                reservations.pop(d.job_id, None)
            elif isinstance(d, Suspend):
                jobs[d.job_id] = replace(jobs[d.job_id], state="SUSPENDING")
            elif isinstance(d, Reserve):
                held[d.job_id] = [Reservation(d.job_id, w.node, w.gpus) for w in d.placement]
            elif isinstance(d, Reject):
                del jobs[d.job_id]
        kept = [r for r in snapshot.reservations if r.job_id not in held and r.job_id in reservations]
        kept += [r for rs in held.values() for r in rs]
        snapshot = replace(snapshot, jobs=tuple(jobs.values()), reservations=tuple(kept))
    return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(), st.sampled_from([1.0, REPLAN_SECONDS, 3600.0, 7 * 86400.0]))
def test_a_plan_of_waits_stays_one_as_time_passes_with_no_event(start: Snapshot, later: float) -> None:
    """What `Settled` rests on: with nothing changed, planning again later admits, suspends, reserves
    and rejects nothing either (time alone reorders low jobs and least-lost-work victims only)."""
    settled = settle(start, T0)
    assume(settled is not None and settled[1])
    assert settled is not None
    snapshot, first = settled
    again = plan(snapshot, T0 + later)
    assert all(isinstance(d, Wait) for d in again), again
    assert sorted(d.job_id for d in again) == sorted(d.job_id for d in first)
