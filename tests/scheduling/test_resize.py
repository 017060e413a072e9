"""Resizing in `plan`: a high job shrinks a resizable job by whole workers instead of suspending
anything; a shrunk job grows back on free GPUs. Table cases, then invariants over random clusters."""

from __future__ import annotations

import copy
from collections import Counter, defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hai_airflow.scheduling import plan
from hai_airflow.scheduling.model import (
    PLACED,
    WAITING,
    Admit,
    Grow,
    Job,
    Node,
    Reject,
    Reservation,
    Reserve,
    Shrink,
    Snapshot,
    Suspend,
    Wait,
    WorkerPlacement,
)
from hai_airflow.scheduling.resize import SETTLE_SECONDS
from hai_airflow.spec import JobState

from .builders import T0, JobBuilder, job, node, snapshot, wp


def pairs(name: str, workers: int, first: int = 0) -> tuple[WorkerPlacement, ...]:
    """`workers` workers of 2 GPUs each on one node, from GPU `first` up."""
    return tuple(wp(name, first + 2 * i, first + 2 * i + 1) for i in range(workers))


def elastic(job_id: int, workers: int, least: int, most: int, since: float = T0 - 600) -> JobBuilder:
    """A low-priority resizable job of 2-GPU workers running on n1 from GPU 0."""
    b = job(job_id).low().gpus(2).running_since(since)
    return b._set(placement=pairs("n1", workers), workers=workers, min_workers=least, max_workers=most)


def test_shrink_instead_of_suspend() -> None:
    """4 of 8 GPUs for a high job: the resizable job gives up 2 of its 4 workers, nothing is suspended."""
    decisions = plan(snapshot([node("n1")], [elastic(5, 4, 2, 4), job(1).high().gpus(4)]), T0)
    assert decisions == [
        Shrink(5, 2, pairs("n1", 2), 1, "shrunk to 2 of its 4 workers so high-priority job 1 can run "
                                        "(giving up workers loses less than a suspension)"),
        Reserve(1, (wp("n1", 4, 5, 6, 7),), "GPUs freed by shrinking job 5 are held for job 1: n1 GPUs 4-7"),
        Wait(1, "waiting for job 5 to shrink to 2 workers", 1, 5),
    ]


def test_keeps_as_many_workers_as_it_can() -> None:
    """2 GPUs needed: only the last worker goes."""
    decisions = plan(snapshot([node("n1")], [elastic(5, 4, 1, 4), job(1).high().gpus(2)]), T0)
    shrink = decisions[0]
    assert isinstance(shrink, Shrink) and shrink.to == 3 and shrink.placement == pairs("n1", 3)


def test_never_below_min_workers_suspends_instead() -> None:
    """6 GPUs needed but the job keeps at least 2 workers (4 GPUs): it is suspended whole."""
    decisions = plan(snapshot([node("n1")], [elastic(5, 4, 2, 4), job(1).high().gpus(6)]), T0)
    assert [type(d) for d in decisions] == [Suspend, Reserve, Wait]
    assert decisions[0].job_id == 5


def test_shrink_preferred_to_suspending_another_job() -> None:
    """The longest-running job is first in victim order, but suspending it loses its whole run."""
    cluster = [node("n1"), node("n2")]
    jobs = [elastic(5, 4, 2, 4, since=T0 - 60),
            job(6).low().gpus(8).running_since(T0 - 6000).on("n2"), job(1).high().gpus(4)]
    decisions = plan(snapshot(cluster, jobs), T0)
    assert isinstance(decisions[0], Shrink) and decisions[0].job_id == 5
    assert not any(isinstance(d, Suspend) for d in decisions)


def test_non_resizable_job_is_suspended_whole() -> None:
    b = job(5).low().gpus(2).running_since(T0 - 600)._set(placement=pairs("n1", 4), workers=4)
    decisions = plan(snapshot([node("n1")], [b, job(1).high().gpus(4)]), T0)
    assert [type(d) for d in decisions] == [Suspend, Reserve, Wait]


def test_grows_back_on_free_gpus() -> None:
    decisions = plan(snapshot([node("n1")], [elastic(5, 2, 2, 4)]), T0)
    assert decisions == [Grow(5, 4, pairs("n1", 4), "grows to 4 of its 4 workers on free GPUs: n1 GPUs 4-5, "
                                                     "n1 GPUs 6-7")]


def test_grows_only_once_settled_since_its_last_start() -> None:
    """A restart pays its start-up: a job shrunk moments ago does not grow back yet."""
    just_started = elastic(5, 2, 2, 4, since=T0 - SETTLE_SECONDS + 1)
    assert plan(snapshot([node("n1")], [just_started]), T0) == []
    assert [type(d) for d in plan(snapshot([node("n1")], [just_started]), T0 + 1)] == [Grow]


def test_grows_as_far_as_room_allows() -> None:
    other = job(7).low().gpus(4).running_since(T0 - 60)._set(placement=(wp("n1", 4, 5, 6, 7),))
    decisions = plan(snapshot([node("n1")], [elastic(5, 1, 1, 4), other]), T0)
    assert len(decisions) == 1 and isinstance(decisions[0], Grow)
    assert decisions[0].to == 2 and decisions[0].placement == pairs("n1", 2)


def test_no_growth_while_a_high_job_waits_for_gpus() -> None:
    """A high job that cannot be placed even by preemption would shrink it straight back."""
    other_high = job(7).high().gpus(2).running_since(T0 - 60)._set(placement=(wp("n1", 6, 7),))
    decisions = plan(snapshot([node("n1")], [elastic(5, 2, 2, 4), other_high, job(1).high().gpus(8)]), T0)
    assert [type(d) for d in decisions] == [Wait]
    decisions = plan(snapshot([node("n1")], [elastic(5, 2, 2, 4), other_high]), T0)
    assert [type(d) for d in decisions] == [Grow], "without the waiting high job it grows"


def test_a_waiting_job_ahead_takes_the_gpus_first() -> None:
    """Queue order decides: a pending job submitted before the resizable one is placed first."""
    early = job(2).low().gpus(4).submitted(T0 - 7200)
    decisions = plan(snapshot([node("n1")], [elastic(5, 2, 2, 4), early]), T0)
    assert [type(d) for d in decisions] == [Admit]


def test_shrunk_job_resumes_at_its_new_size_on_its_reserved_gpus() -> None:
    shrunk = job(5).low().gpus(2).suspended(T0 - 5)._set(workers=2, min_workers=2, max_workers=4)
    high = job(1).high().gpus(4).running_since(T0 - 1)._set(placement=(wp("n1", 4, 5, 6, 7),))
    kept = Reservation(5, "n1", (0, 1, 2, 3))
    decisions = plan(snapshot([node("n1")], [shrunk, high], reservations=(kept,)), T0)
    reason = "resumes on n1 GPUs 0-1, n1 GPUs 2-3 on its reserved GPUs"
    assert decisions == [Admit(5, pairs("n1", 2), True, reason)]


def test_a_stopping_job_keeps_the_gpus_it_grows_onto() -> None:
    """Between its Grow and its restart, its new GPUs are free but held for it."""
    growing = elastic(5, 2, 2, 4).suspending()._set(workers=4)
    held = Reservation(5, "n1", tuple(range(8)))
    pending = job(2).low().gpus(4)
    decisions = plan(snapshot([node("n1")], [growing, pending], reservations=(held,)), T0)
    assert [type(d) for d in decisions] == [Wait]


def test_high_resizable_job_grows_within_quota_only() -> None:
    b = elastic(5, 2, 1, 4).high()
    decisions = plan(snapshot([node("n1")], [b], users={"alice": 6}), T0)
    assert decisions == [Grow(5, 3, pairs("n1", 3), "grows to 3 of its 4 workers on free GPUs: n1 GPUs 4-5")]


# ---- invariants --------------------------------------------------------------------------------


@st.composite
def clusters(draw: st.DrawFn) -> Snapshot:
    """Nodes of 8 GPUs; running jobs of 2-GPU workers, some resizable (possibly below their size);
    waiting jobs, some high."""
    nodes = [Node(f"n{i}", "V100", 8, 32, 256) for i in range(draw(st.integers(1, 3)))]
    free = {n.name: list(range(8)) for n in nodes}
    jobs: list[Job] = []
    for i in range(draw(st.integers(0, 6))):
        most = draw(st.integers(1, 6))
        size = draw(st.integers(1, most))
        placement = []
        for _ in range(size):
            n = next((n for n in free if len(free[n]) >= 2), None)
            if n is None:
                break
            placement.append(WorkerPlacement(n, (free[n].pop(0), free[n].pop(0))))
        if not placement:
            continue
        size = len(placement)
        least = draw(st.integers(0, size))
        jobs.append(Job(
            id=100 + i, user="alice", group="vision", submitted_at=T0 - draw(st.integers(0, 5000)),
            state=JobState.RUNNING, max_schedule=draw(st.sampled_from([0, 0, 4])), workers=size,
            gpus_per_worker=2, gpu_type="V100", started_at=T0 - draw(st.integers(1, 4000)),
            placement=tuple(placement), min_workers=least, max_workers=max(most, size) if least else 0,
        ))
    for i in range(draw(st.integers(0, 4))):
        jobs.append(Job(
            id=1 + i, user="bob", group="nlp", submitted_at=T0 - draw(st.integers(0, 5000)),
            state=JobState.PENDING, max_schedule=draw(st.sampled_from([0, 4])),
            workers=draw(st.integers(1, 3)), gpus_per_worker=draw(st.sampled_from([1, 2, 4, 8])),
            gpu_type="V100",
        ))
    return Snapshot(tuple(nodes), tuple(jobs), policy=draw(st.sampled_from(["seed", "least-lost-work"])))


def gpus_of(placement: tuple[WorkerPlacement, ...]) -> set[tuple[str, int]]:
    return {(w.node, g) for w in placement for g in w.gpus}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_resize_invariants(snap: Snapshot) -> None:
    before = copy.deepcopy(snap)
    decisions = plan(snap, T0)
    assert snap == before and plan(snap, T0) == decisions
    jobs = {j.id: j for j in snap.jobs}
    after = {j.id: j.placement for j in snap.jobs if j.state in PLACED}
    resized: set[int] = set()
    for d in decisions:
        if isinstance(d, Shrink):
            j = jobs[d.job_id]
            assert j.resizable and j.state == JobState.RUNNING and not j.high
            assert j.min_workers <= d.to == len(d.placement) < j.workers, "never below min_workers"
            assert d.placement == j.placement[: d.to], "keeps its own first workers"
            assert jobs[d.preemptor_id].high
            assert any(isinstance(r, Reserve) and r.job_id == d.preemptor_id for r in decisions)
            after[j.id] = d.placement
        elif isinstance(d, Grow):
            j = jobs[d.job_id]
            assert j.resizable and j.workers < d.to == len(d.placement) <= j.max_workers, "above workers"
            assert d.placement[: j.workers] == j.placement
            assert j.started_at is not None and T0 - j.started_at >= SETTLE_SECONDS, "settled first"
            after[j.id] = d.placement
        elif isinstance(d, Suspend):
            del after[d.job_id]
        elif isinstance(d, Admit | Reserve):
            after[d.job_id] = d.placement
        if isinstance(d, Shrink | Grow):
            assert d.job_id not in resized, "one resize per job per cycle"
            resized.add(d.job_id)
            assert all(len(w.gpus) == 2 for w in d.placement)
    owner: dict[tuple[str, int], int] = {}
    for job_id, placement in after.items():
        for key in gpus_of(placement):
            assert owner.setdefault(key, job_id) == job_id, f"GPU {key} given to {owner[key]} and {job_id}"
    verdicts = Counter(d.job_id for d in decisions if isinstance(d, Admit | Wait | Reject))
    assert verdicts == Counter(j.id for j in snap.jobs if j.state in WAITING)


@pytest.mark.parametrize("resizable", [False, True])
def test_quota_counts_a_shrunk_high_job_at_its_size(resizable: bool) -> None:
    """A high job at 2 of 4 workers holds 4 GPUs of quota, so another 4-GPU high job fits a quota of 8."""
    b = elastic(5, 2, 2, 4).high() if resizable else job(5).high().gpus(2).running_since(T0 - 60)._set(
        placement=pairs("n1", 2), workers=2)
    other = job(1).high().gpus(4).by("alice").submitted(T0 - 7200)
    decisions = plan(snapshot([node("n1"), node("n2")], [b, other], users={"alice": 8}), T0)
    assert isinstance(decisions[0], Admit) and decisions[0].job_id == 1
    used: defaultdict[str, int] = defaultdict(int)
    for d in decisions:
        if isinstance(d, Grow):
            used["grow"] += 1
    assert used["grow"] == 0, "the quota is used up: it does not grow past it"
