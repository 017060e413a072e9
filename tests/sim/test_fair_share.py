"""The simulator's fair share: it measures each user's use as the server does, and reports how the low
jobs' waits spread over users."""

from __future__ import annotations

import pytest
from sim_builders import JobBuilder, job, node, trace

from hai_airflow.sim import simulate, summarize
from hai_airflow.sim.metrics import jain


def _flood() -> list[JobBuilder]:
    """Alice's five low jobs of 100 s on one GPU at 0, dave's one at 50, a high job of bob's at 120."""
    alices = [job(i).low().gpus(1).lasting(100).at(0).of("alice", "vision") for i in range(1, 6)]
    return [*alices, job(9).low().gpus(1).lasting(100).at(50).of("dave", "nlp"),
            job(10).high(4).gpus(1).lasting(10).at(120).of("bob", "vision")]  # fmt: skip


@pytest.mark.parametrize(
    ("fair_share", "dave_starts"),
    [
        pytest.param(False, 530.0, id="without the term dave waits for all of alice's jobs"),
        pytest.param(True, 100.0, id="with it dave goes next, alice having used the GPU"),
    ],
)
def test_a_user_who_used_less_goes_first(fair_share: bool, dave_starts: float) -> None:
    run = simulate(trace([node("n1", gpus=1)], _flood()), "seed", fair_share=fair_share)
    started = {o.job.id: o.first_started_at for o in run.outcomes}
    assert started[9] == dave_starts
    assert started[10] == 120.0  # the high job preempts at once either way
    summary = summarize(run)
    assert summary.fair_share is fair_share
    assert summary.high_within_max_schedule == 1.0


def test_the_spread_of_low_waits_over_users_is_reported() -> None:
    summary = summarize(simulate(trace([node("n1", gpus=1)], _flood()), "seed", fair_share=False))
    # alice's jobs start at 0, 100 (suspended at 120 for bob's high job, resumed at 130), 230, 330, 430;
    # dave's at 530: he waited 480 s, alice 230 s at the median.
    assert summary.low_user_median_min_s is not None and summary.low_user_median_max_s is not None
    assert summary.low_user_median_min_s < summary.low_user_median_max_s == 480.0
    assert summary.low_user_mean_jain is not None and 0.5 < summary.low_user_mean_jain < 1.0


@pytest.mark.parametrize(
    ("values", "index"),
    [
        pytest.param([3.0, 3.0, 3.0], 1.0, id="all equal: 1"),
        pytest.param([4.0, 0.0, 0.0, 0.0], 0.25, id="one does all the waiting: 1/n"),
        pytest.param([0.0, 0.0], None, id="nobody waited: none"),
    ],
)
def test_jains_index(values: list[float], index: float | None) -> None:
    assert jain(values) == (pytest.approx(index) if index is not None else None)
