"""Tests of the priority weight: the queue and resume order and its explanation."""

from __future__ import annotations

import pytest

from hai_airflow.scheduling import weight
from hai_airflow.scheduling.model import Job

from .builders import T0, job


def queue(*jobs: Job) -> list[int]:
    return [j.id for j in sorted(jobs, key=lambda j: weight(j, T0).sort_key)]


@pytest.mark.parametrize(
    ("jobs", "order"),
    [
        pytest.param(
            [job(1).low().submitted(T0 - 9000).build(), job(2).high(48).submitted(T0).build()],
            [2, 1],
            id="any high job before any low job",
        ),
        pytest.param(
            [job(1).high(24).submitted(T0 - 3600).build(), job(2).high(4).submitted(T0).build()],
            [2, 1],
            id="high jobs by earliest deadline, not by submit time",
        ),
        pytest.param(
            [job(1).low().submitted(T0 - 100).build(), job(2).low().submitted(T0 - 200).build()],
            [2, 1],
            id="low jobs by waiting time",
        ),
        pytest.param(
            [job(1).low().submitted(T0 - 1000).build(),
             job(2).low().submitted(T0 - 900).suspended(since=T0 - 600).build()],
            [2, 1],
            id="time lost to suspension lets an interrupted job resume first",
        ),
        pytest.param(
            [job(2).low().submitted(T0 - 5).build(), job(1).low().submitted(T0 - 5).build()],
            [1, 2],
            id="ties broken by job id",
        ),
    ],
)
def test_queue_order(jobs: list[Job], order: list[int]) -> None:
    assert queue(*jobs) == order


def test_score_is_the_sum_of_its_terms_and_orders_like_the_sort_key() -> None:
    jobs = [
        job(1).low().submitted(T0 - 1000).suspended(since=T0 - 300, before=50).build(),
        job(2).high(4).submitted(T0 - 100).build(),
        job(3).low().submitted(T0 - 700).build(),
    ]
    weights = {j.id: weight(j, T0) for j in jobs}
    assert weights[1].score == pytest.approx(1000 + 2 * (300 + 50))
    assert [t.name for t in weights[1].terms] == ["priority class", "waiting", "lost to suspension"]
    for w in weights.values():
        assert w.score == pytest.approx(sum(t.value for t in w.terms))
    by_score = sorted(weights, key=lambda i: -weights[i].score)
    assert by_score == queue(*jobs) == [2, 1, 3]
    assert weights[2].sort_key[-1] == 2
