"""The controller's kept cluster state, changed only by the store's change feed, always equals a fresh
read of the store: after every request and every controller step of random runs (real API, real
controller, real processes, SQLite and PostgreSQL), and no write reaches the store unsaid."""

from __future__ import annotations

import dataclasses
import gc
import random
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import select, update

from hai_airflow.scheduling import plan
from hai_airflow.scheduling.model import WAITING, Wait
from hai_airflow.server.control import gc_freeze
from hai_airflow.server.control.mirror import differences, read_all
from hai_airflow.server.jobs.kept import KeptInstance, KeptJob
from hai_airflow.server.store import changes
from hai_airflow.server.store.tables import ChangeRow, JobRow, ReservationRow
from tests.server.conftest import Api
from tests.server.test_changes_recorded import unsaid_writes

USERS = ("alice", "bob", "dave")
PACKAGES = (454, 455, 456, 457)

UNSAID_ON_PURPOSE = {"test_a_write_that_bypasses_the_feed_is_found_by_the_resync_and_counted"}
"""Tests that write a job without saying so (`changes.jobs_changed`), to see what the resync finds."""


@pytest.fixture(autouse=True)
def unsaid(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """Every test here runs with the check that each Core write of a job said first which jobs it
    changes (`test_changes_recorded.unsaid_writes`)."""
    with unsaid_writes() as found:
        yield found
    if request.node.originalname not in UNSAID_ON_PURPOSE:
        assert found == [], found[0]


def check_kept(api: Api) -> None:
    """The controller's kept copy, brought up to date by the feed alone, equals a full read; and
    only waiting jobs hold reservations (a job that ends after running has none to drop)."""
    controller = api.controller
    assert controller is not None
    with api.ctx.store.read() as s:
        controller.follower.catch_up(s)
    kept = controller.follower.kept
    assert kept is not None
    with api.ctx.store.read() as s:
        fresh = read_all(s, api.ctx.config.server.policy)
    assert kept.last_change == fresh.last_change
    assert differences(kept, fresh) == []
    assert kept.jobs == fresh.jobs and kept.current == fresh.current  # the records, field by field
    with api.ctx.store.read() as s:
        holders = s.execute(
            select(JobRow.id, JobRow.state).join(ReservationRow, ReservationRow.job_id == JobRow.id)
        )
        assert [(job_id, state) for job_id, state in holders if state not in WAITING] == []


def check_settled(api: Api) -> bool:
    """A controller that would skip its next plan is right to: a plan over a fresh read only waits."""
    controller = api.controller
    assert controller is not None
    now = time.time()
    if controller.settled is None or controller.settled.holds(controller.follower.state, now) is None:
        return False
    with api.ctx.store.read() as s:
        fresh = read_all(s, api.ctx.config.server.policy)
    decisions = plan(fresh.state.snapshot(), now, fresh.state.usage)
    assert all(isinstance(d, Wait) for d in decisions), decisions
    return True


WRITE_PATHS = {
    "submit",
    "cancel",
    "suspend",
    "resume",
    "hold",
    "release",
    "requeue",
    "promote",
    "group-quota",
    "user-quota",
    "drain",
    "undrain",
}
"""Every kind of write `act` makes (its answer's first word); each seed below takes every one, and a
request the API refused answers `refused ...` (it wrote nothing)."""


def done(r: Any, what: str, *refusals: int) -> str:
    """`what` if the API did it; `refused what` for an expected refusal (anything else fails)."""
    assert r.status_code in (200, 201, *refusals), (what, r.text)
    return what if r.status_code in (200, 201) else f"refused {what}"


HOLDS = ("held by", "suspended by admin")
"""How a held job's reason begins: its owner's hold, or an admin's."""


def pick(api: Api, rng: random.Random, states: str, keep: Callable[[str], bool] = bool) -> int | None:
    """One of the jobs in these states (comma-separated) whose reason `keep` keeps; None if none is."""
    found = [
        j["id"]
        for j in api.get("/jobs", params={"all": True, "state": states}).json()
        if keep(j["reason"] or "")
    ]
    return rng.choice(sorted(found)) if found else None


def submit(api: Api, rng: random.Random, jobs: list[int]) -> tuple[int | None, str]:
    """A random job of a random user, its id None when refused (over the high-priority quota)."""
    user = rng.choice(USERS)
    high = rng.random() < 0.4
    body: dict[str, Any] = {
        "resource_pkg": rng.choice(PACKAGES),
        "cmd": rng.choice(("true", "sleep 30", "exit 3")),
        "max_schedule": rng.choice((4, 8)) if high else 0,
    }
    if rng.random() < 0.2:
        body = {"mode": "distributed", "cmd": "sleep 30", "max_schedule": body["max_schedule"]}
    r = api.post("/jobs", user, json={"spec": api.spec(**body)})
    assert r.status_code in (201, 409), r.text  # 409: over the high-priority quota
    if r.status_code != 201:
        return None, f"submit {body}"
    jobs.append(r.json()["id"])
    return jobs[-1], f"submit {body}"


def act(api: Api, rng: random.Random, jobs: list[int]) -> str:
    """One random request a user or an admin could make."""
    roll = rng.random()
    if 0.2 <= roll < 0.3:  # an admin drains the node, or undrains it
        drained = api.get("/nodes").json()[0]["state"] != "ready"
        action = "undrain" if drained else "drain"
        return done(api.post(f"/nodes/node1/{action}", json=None if drained else {}), f"{action} node1")
    if roll < 0.35 or not jobs:
        return submit(api, rng, jobs)[1]
    job_id = rng.choice(jobs)
    if roll < 0.43:
        api.post(f"/jobs/{job_id}/cancel", "admin")
        return f"cancel {job_id}"
    if roll < 0.49:
        api.post(f"/jobs/{job_id}/suspend", "admin")
        return f"suspend {job_id}"
    if roll < 0.55:
        api.post(f"/jobs/{job_id}/resume", "admin")
        return f"resume {job_id}"
    if roll < 0.64:
        unheld = pick(api, rng, "PENDING,SUSPENDED", lambda reason: not reason.startswith(HOLDS))
        # else a job submitted now: it waits, as the controller has not stepped since
        waiting = unheld or submit(api, rng, jobs)[0] or job_id
        return done(api.post(f"/jobs/{waiting}/hold", api.job(waiting)["user"]), f"hold {waiting}", 409)
    if roll < 0.75:
        held = pick(api, rng, "PENDING,SUSPENDED", lambda reason: reason.startswith(HOLDS[0])) or job_id
        # 403: an admin's hold; 409: no job is held
        return done(api.post(f"/jobs/{held}/release", api.job(held)["user"]), f"release {held}", 403, 409)
    if roll < 0.83:
        ended = pick(api, rng, "FAILED,CANCELLED") or job_id
        r = api.post(f"/jobs/{ended}/requeue", api.job(ended)["user"], json={"fresh": rng.random() < 0.5})
        if r.status_code == 201:
            jobs.append(r.json()["id"])
        # 409: not ended, succeeded, or over the quota by now
        return done(r, f"requeue {ended}", 409)
    if roll < 0.88:
        api.post(f"/jobs/{job_id}/promote", "admin", json={"max_schedule": 8})
        return f"promote {job_id}"
    gpus = rng.choice((0, 8, 16, None))
    if roll < 0.94:
        r = api.put("/quotas/groups/vision", "admin", json={"gpus": gpus})
        assert r.status_code == 200, r.text
        return f"group-quota vision {gpus}"
    user = rng.choice(USERS)
    r = api.put(f"/quotas/users/{user}", "admin", json={"gpus": gpus})
    assert r.status_code == 200, r.text
    return f"user-quota {user} {gpus}"


@pytest.mark.parametrize("seed", [2, 3])
def test_the_kept_state_equals_a_fresh_read_after_every_change(
    api: Api, unsaid: list[str], seed: int
) -> None:
    rng = random.Random(seed)
    controller = api.with_controller()
    api.step()  # takes the lease and reads the store whole
    resynced = controller.keeper.last_resync
    jobs: list[int] = []
    settled = 0
    taken: set[str] = set()
    for _ in range(50):
        what = act(api, rng, jobs)
        taken.add(what.split()[0])
        api.step()
        try:
            assert unsaid == [], unsaid[0]
            check_kept(api)
            settled += check_settled(api)
        except AssertionError as e:
            raise AssertionError(f"after {what}: {e}") from e
    assert taken - {"refused"} == WRITE_PATHS, "a write path went untried"
    # Every cycle above was planned from the feed, not from a full read.
    assert controller.keeper.last_resync == resynced
    assert settled, "no step left the cluster settled: the skip went unchecked"
    with api.ctx.store.read() as s:
        kinds = set(s.scalars(select(ChangeRow.kind)))
        assert changes.newest(s)[1] > 40
    assert {changes.JOB, changes.QUOTA, changes.NODES} <= kinds


def test_a_change_made_by_another_server_reaches_the_kept_state(api_factory: Any) -> None:
    """Two servers on one store: the API of the standby takes a job the active controller then runs."""
    active, standby = api_factory(), api_factory()
    active.with_controller()
    active.step()
    job = standby.submit("alice", cmd="true")
    active.until_state(job["id"], "SUCCEEDED")
    check_kept(active)


def test_a_reservation_cleared_by_a_bare_delete_leaves_the_kept_state(api: Api) -> None:
    """A preemptor held by an admin loses its reservation in a transaction that changes no row object."""
    api.with_controller()
    low = api.submit("alice", cmd="sleep 30", resource_pkg=457)
    api.until_state(low["id"], "RUNNING")
    high = api.submit("bob", cmd="sleep 30", resource_pkg=457, max_schedule=8, grace_seconds=20, elastic=True)
    api.until(lambda: api.job(low["id"])["state"] == "SUSPENDING", what="the low job being suspended")
    with api.ctx.store.read() as s:
        assert api.controller is not None
        api.controller.follower.catch_up(s)
    assert api.controller.follower.view().snapshot.reservations, "the preemptor holds a reservation"
    assert api.post(f"/jobs/{high['id']}/suspend", "admin").status_code == 200
    api.step()
    check_kept(api)
    assert api.controller.follower.view().snapshot.reservations == ()


def test_a_full_read_freezes_what_survives_it_and_the_next_gives_it_back(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a full read the kept state is out of the collector's sight (no 100 ms pause in a later
    cycle); garbage it cannot see is collected at the next full read, not kept for ever."""

    class Cyclic:
        me: Any

    monkeypatch.setattr(gc_freeze, "FREEZE_AT_JOBS", 0)
    controller = api.with_controller()
    api.submit("alice", cmd="sleep 30")
    cyclic = Cyclic()
    cyclic.me = cyclic
    dead = weakref.ref(cyclic)
    try:
        api.step()  # takes the lease and reads the store whole
        assert gc.get_freeze_count() > 0
        del cyclic
        gc.collect()
        assert dead() is not None, "frozen garbage is not the collector's"
        api.step()  # from the feed: nothing is given back
        gc.collect()
        assert dead() is not None
        controller.keeper.last_resync = 0.0  # the resync interval is over
        api.step()
        assert dead() is None, "the next full read left frozen garbage behind"
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_a_write_that_bypasses_the_feed_is_found_by_the_resync_and_counted(api: Api) -> None:
    """The resync is the safety net behind the feed: what it finds is an alarm (a metric), not only a
    log line, and the kept copy is replaced by the store's."""
    controller = api.with_controller()
    job = api.submit("alice", cmd="sleep 30", max_schedule=0)
    api.step()
    api.until_state(job["id"], "RUNNING")
    api.step()  # the start is applied: nothing more changes this job by itself
    drifts = controller.ctx.metrics.kept_state_drifts
    before = drifts._value.get()
    with api.ctx.store.write() as s:  # a write with no change row: what the feed cannot carry
        s.execute(update(JobRow).where(JobRow.id == job["id"]).values(held=True))
    api.step()
    kept = controller.follower.kept
    assert kept is not None and job["id"] not in kept.requests, "the feed carried it after all"
    assert drifts._value.get() == before
    controller.keeper.last_resync = 0.0  # the resync interval is over
    api.step()
    assert drifts._value.get() == before + 1
    assert api.until_state(job["id"], "SUSPENDED")["state"] == "SUSPENDED"  # the hold, now seen


def test_a_kept_record_cannot_be_changed_in_place_only_replaced(api: Api) -> None:
    """The kept records are frozen: a change is a new record stored in their place, so nothing can
    change the kept state unseen (as an ORM row set in place could)."""
    controller = api.with_controller()
    job = api.submit("alice", cmd="sleep 30")
    api.step()
    api.until_state(job["id"], "RUNNING")
    api.step()
    kept = controller.follower.kept
    assert kept is not None
    record, current = kept.jobs[job["id"]], kept.current[job["id"]]
    assert isinstance(record, KeptJob) and isinstance(current, KeptInstance)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.reason = "changed in place"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        current.stop_kind = "preempt"  # type: ignore[misc]
    with pytest.raises(AttributeError):  # slots: no attribute can be added either
        object.__setattr__(record, "note", "added")
    kept.reason_written(job["id"], "a reason the controller wrote")
    assert kept.jobs[job["id"]] == dataclasses.replace(record, reason="a reason the controller wrote")
    assert record.reason != "a reason the controller wrote", "the record kept before is unchanged"
