"""Tests of the fair-share term: a user's recent use orders low-priority jobs among themselves."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hai_airflow.scheduling import plan, weight
from hai_airflow.scheduling.fairshare import (
    FAIR_SHARE_SECONDS,
    HALF_LIFE_SECONDS,
    FairShare,
    charge_rate,
    decayed,
    run_use,
)
from hai_airflow.scheduling.model import Admit, Job, Wait
from hai_airflow.scheduling.state import ClusterState

from .builders import T0, job, node, snapshot, wp

HEAVY = FairShare({"alice": 3_000_000.0, "bob": 1_000_000.0, "dave": 0.0})
"""Alice used most of the cluster lately, bob a third as much, dave nothing."""


@pytest.mark.parametrize(
    ("fair_share", "user", "factor"),
    [
        pytest.param(FairShare(), "dave", 1.0, id="no use measured: everyone's factor is 1"),
        pytest.param(FairShare({"alice": 5.0}), "alice", 0.5, id="the only user uses the mean: 0.5"),
        pytest.param(HEAVY, "dave", 1.0, id="no recent use: 1"),
        pytest.param(HEAVY, "carol", 1.0, id="a user not listed used nothing: 1"),
        pytest.param(HEAVY, "bob", 2**-0.75, id="below the mean (4/3 M): above 0.5"),
        pytest.param(HEAVY, "alice", 2**-2.25, id="above the mean: below 0.5"),
    ],
)
def test_factor_is_two_to_minus_use_over_mean(fair_share: FairShare, user: str, factor: float) -> None:
    assert fair_share.factor(user) == pytest.approx(factor)
    assert fair_share.term(user) == pytest.approx(FAIR_SHARE_SECONDS * factor)


def test_use_decays_by_half_every_half_life() -> None:
    assert decayed(8.0, T0, T0 + 2 * HALF_LIFE_SECONDS) == pytest.approx(2.0)
    one_hour = run_use(4.0, T0, T0 + 3600, T0 + 3600)
    assert one_hour == pytest.approx(4 * 3600, rel=1e-2)  # just used: almost undecayed
    later = run_use(4.0, T0, T0 + 3600, T0 + 3600 + HALF_LIFE_SECONDS)
    assert later == pytest.approx(one_hour / 2)


def test_a_cpu_job_is_charged_its_cores_over_cores_per_gpu() -> None:
    assert charge_rate(2, 64) == 2.0
    assert charge_rate(0, 16) == pytest.approx(2.0)


def test_weight_shows_the_term_for_low_jobs_only() -> None:
    low = job(1).low().by("dave").submitted(T0 - 100).build()
    shown = weight(low, T0, HEAVY)
    assert [t.name for t in shown.terms][-1] == "fair share"
    assert shown.terms[-1].value == pytest.approx(FAIR_SHARE_SECONDS)
    assert shown.score == pytest.approx(100 + FAIR_SHARE_SECONDS)
    high = job(2).high(4).by("dave").build()
    assert "fair share" not in [t.name for t in weight(high, T0, HEAVY).terms]
    assert "fair share" not in [t.name for t in weight(low, T0).terms]


def _order(jobs: list[Job], fair_share: FairShare | None, policy: str = "seed") -> list[int]:
    snap = replace(
        snapshot([node("n1")], [*jobs, job(99).running_since(T0 - 10).gpus(8).on("n1")], policy=policy),
        fair_share=fair_share,
    )
    return [d.job_id for d in plan(snap, T0) if isinstance(d, Wait)]


@pytest.mark.parametrize(
    ("fair_share", "policy", "order"),
    [
        pytest.param(None, "seed", [1, 2, 3, 4], id="without figures: high, then low by waiting"),
        pytest.param(HEAVY, "seed", [1, 4, 3, 2], id="low jobs of who used less go first; high stays first"),
        pytest.param(HEAVY, "fifo", [1, 2, 3, 4], id="fifo ignores the fair share"),
    ],
)
def test_the_term_orders_low_jobs_among_themselves(
    fair_share: FairShare | None, policy: str, order: list[int]
) -> None:
    jobs = [
        job(1).high(4).by("alice").submitted(T0 - 7200).build(),
        job(2).low().by("alice").submitted(T0 - 7000).build(),
        job(3).low().by("bob").submitted(T0 - 6000).build(),
        job(4).low().by("dave").submitted(T0 - 60).build(),
    ]
    assert _order(jobs, fair_share, policy) == order


def test_daves_one_low_job_starts_before_alices_many_older_ones() -> None:
    """Finding 6 of issue 56: behind alice's flood of low jobs, dave's one low job starts next."""
    alices = [job(i).low().by("alice").gpus(1).submitted(T0 - 86_400 + i) for i in range(1, 201)]
    daves = job(500).low().by("dave").gpus(1).submitted(T0 - 30)
    busy = job(900).low().by("alice").gpus(7).running_since(T0 - 3600).on("n1")
    snap = replace(
        snapshot([node("n1")], [*alices, daves, busy]),
        fair_share=FairShare({"alice": 7 * 3600.0 * 200, "dave": 0.0}),
    )
    decisions = plan(snap, T0)
    assert decisions[0] == Admit(500, (wp("n1", 7),), False, "starts on n1 GPU 7")
    assert [d.job_id for d in decisions[1:4]] == [1, 2, 3]
    assert all(isinstance(d, Wait) for d in decisions[1:])


def test_measured_use_reaches_the_snapshot_without_counting_as_an_event() -> None:
    state = ClusterState([node("n1")])
    events = state.events
    state.use_measured(HEAVY)
    assert state.events == events
    assert state.snapshot().fair_share is HEAVY
