"""When the controller may skip planning: `Settled` after a plan of waits only, until the next event,
and the cluster state's event count that says whether one arrived."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from hai_airflow.scheduling import plan
from hai_airflow.scheduling.model import (
    PLACED,
    Admit,
    Decision,
    Job,
    Quota,
    Reject,
    Reservation,
    Reserve,
    Snapshot,
    Suspend,
    Wait,
    WorkerPlacement,
)
from hai_airflow.scheduling.settled import REPLAN_SECONDS, Settled, waits_anyway
from hai_airflow.scheduling.state import ClusterState

from .builders import T0, job, node
from .test_plan_properties import USERS, shapes, snapshots


def full_cluster() -> ClusterState:
    """One V100 node, all 8 GPUs taken by a running low job, a second 8-GPU job waiting for them."""
    state = ClusterState([node("n1")])
    state.job_changed(job(1).gpus(8).running_since(T0 - 600).on("n1").build())
    state.job_changed(job(2).gpus(8).build())
    return state


def test_a_plan_of_waits_settles_and_any_other_decision_does_not() -> None:
    state = full_cluster()
    waits = [Wait(2, "no room", 1)]
    assert Settled.after(waits, state, T0) == Settled(state.events, T0, arrived=2)
    assert Settled.after([], state, T0) == Settled(state.events, T0, arrived=2)
    assert Settled.after([*waits, Admit(3, (), False, "fits")], state, T0) is None


def test_settled_holds_until_an_event_or_the_replan_interval() -> None:
    state = full_cluster()
    settled = Settled(state.events, T0, arrived=2)
    assert settled.holds(state, T0 + REPLAN_SECONDS - 0.1) == settled
    assert settled.holds(state, T0 + REPLAN_SECONDS) is None, "time alone ends it at the interval"
    state.job_changed(job(2).gpus(8).high().build())
    assert settled.holds(state, T0 + 0.1) is None, "an event ends it"


def test_new_jobs_that_wait_anyway_keep_it_settled_and_any_other_does_not() -> None:
    state = full_cluster()
    settled = Settled.after(plan(state.snapshot(), T0, state.usage), state, T0)
    assert settled is not None
    state.job_changed(job(4).gpus(1).build())
    state.job_changed(job(3).gpus(2).build())  # ids need not come in order (commits on PostgreSQL)
    moved = settled.holds(state, T0 + 1)
    assert moved == Settled(state.events, T0, arrived=4), "two low jobs with no room: still settled"
    assert moved.holds(state, T0 + 2) == moved
    for arrival, why in [
        (job(5).gpus(2).high().build(), "a high job may preempt"),
        (job(5).gpus(16).build(), "a job no node can hold is rejected"),
        (job(5).gpus(1, "A100").build(), "no A100 node: rejected"),
        (job(5).cpu_only(4, 8).build(), "a CPU job fits beside the GPUs"),
    ]:
        again = full_cluster()
        again.job_changed(job(3).gpus(2).build())
        again.job_changed(arrival)
        assert Settled(again.events - 2, T0, arrived=2).holds(again, T0 + 1) is None, why
    changed = full_cluster()
    changed.job_changed(job(3).gpus(2).build())
    changed.job_changed(job(2).gpus(4).build())
    assert Settled(changed.events - 2, T0, arrived=2).holds(changed, T0 + 1) is None, "an old job changed too"
    fifo = full_cluster()
    fifo.policy = "fifo"
    fifo.job_changed(job(3).gpus(2).build())
    assert Settled(fifo.events - 1, T0, arrived=2).holds(fifo, T0 + 1) is None, "fifo guards any job"


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
        if all(isinstance(d, Wait) for d in decisions):
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


def fillers(snapshot: Snapshot) -> list[Job]:
    """Running low one-worker jobs that take every GPU the snapshot's placed jobs leave free."""
    used: dict[str, set[int]] = {n.name: set() for n in snapshot.nodes}
    for j in snapshot.jobs:
        if j.state in PLACED:
            for w in j.placement:
                used[w.node].update(w.gpus)
    out = []
    for n in snapshot.nodes:
        free = tuple(g for g in range(n.gpus) if g not in used[n.name])
        if free:
            out.append(Job(id=500 + len(out), user="alice", group="vision", state="RUNNING", max_schedule=0,
                           submitted_at=T0 - 200, started_at=T0 - 100, gpus_per_worker=len(free),
                           gpu_type=n.gpu_type, placement=(WorkerPlacement(n.name, free, 0, 0),)))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(), st.lists(shapes(), min_size=1, max_size=3), st.data())
def test_new_jobs_that_wait_anyway_change_no_other_decision(
    start: Snapshot, arrivals: list[dict[str, Any]], data: st.DataObject
) -> None:
    """What moving `Settled` past new jobs rests on: when `waits_anyway` says so, a plan with them
    makes each of them wait and decides for every other job exactly as the plan without them."""
    if data.draw(st.booleans()):  # often a full cluster: what it is for
        start = replace(start, jobs=(*start.jobs, *fillers(start)))
    settled = settle(start, T0)
    assume(settled is not None)
    assert settled is not None
    snapshot, _ = settled
    now = T0 + 1
    new = []
    for i, shape in enumerate(arrivals):
        user = shape.pop("user")
        if data.draw(st.integers(0, 9)):  # mostly low and fitting some node: the case it is for
            kind = data.draw(st.sampled_from([n for n in snapshot.nodes if n.gpus]))  if any(
                n.gpus for n in snapshot.nodes) else None
            shape.update(max_schedule=0, workers=data.draw(st.sampled_from([1, 1, 2])), cpus_per_worker=0,
                         memory_gb_per_worker=0, gpu_type=kind.gpu_type if kind else None,
                         gpus_per_worker=data.draw(st.integers(1, kind.gpus)) if kind else 0)
        new.append(Job(id=1000 + i, user=user, group=USERS[user], state="PENDING",
                       submitted_at=T0 - data.draw(st.integers(0, 3000)), **shape))
    after = replace(snapshot, jobs=(*snapshot.jobs, *new))
    anyway = waits_anyway(ClusterState.load(after.nodes, after.jobs, after.reservations, after.quota,
                                            after.policy), new)
    event(f"waits anyway: {anyway}")
    if not anyway:
        return
    before = {d.job_id: (d.reason, d.blocked_by) for d in plan(snapshot, now) if isinstance(d, Wait)}
    decisions = plan(after, now)
    assert all(isinstance(d, Wait) for d in decisions), decisions
    waits = {d.job_id: (d.reason, d.blocked_by) for d in decisions if isinstance(d, Wait)}
    assert {k: v for k, v in waits.items() if k < 1000} == before
    assert {j.id for j in new} <= waits.keys()
