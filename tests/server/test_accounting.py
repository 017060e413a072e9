"""The accounting rules, pure: what counts in a window, for whom, and how waits are summarised."""

from __future__ import annotations

import pytest

from hai_airflow.server.jobs.accounting import (
    DAY,
    HOUR,
    JobRecord,
    Run,
    daily_gpu_hours,
    days,
    percentile,
    report,
    waiting_at,
)
from hai_airflow.spec import JobState

SINCE, UNTIL = 1000.0, 1000.0 + 10 * HOUR


def by_user(user: str, group: str) -> str:
    return user


def by_group(user: str, group: str) -> str:
    return group


def run(
    user: str = "alice",
    start: float = SINCE,
    hours: float | None = 1,
    group: str = "vision",
    high: bool = False,
    gpus: int = 2,
    lost_gpu_seconds: float = 0.0,
) -> Run:
    end = None if hours is None else start + hours * HOUR
    return Run(user, group, high, gpus, start, end, lost_gpu_seconds)


def job(
    submitted: float, first: float | None, ended: float | None, state: JobState, user: str = "alice"
) -> JobRecord:
    return JobRecord(user, "vision", submitted, first, ended, state)


def test_gpu_hours_are_gpus_times_the_part_of_each_run_inside_the_window() -> None:
    runs = [
        run(start=SINCE - 2 * HOUR, hours=3),  # 1 h inside
        run(start=SINCE + 2 * HOUR, hours=1, high=True),  # all inside
        run(start=UNTIL - HOUR / 2, hours=None),  # still running: up to `until`
        run(start=UNTIL + HOUR, hours=1),  # after the window
    ]
    (alice,) = report([], runs, SINCE, UNTIL, by_user)
    assert (alice.low_gpu_hours, alice.high_gpu_hours) == (2 * 1 + 2 * 0.5, 2 * 1)
    assert alice.gpu_hours == 5


def test_a_loss_counts_in_the_window_its_run_ended_in() -> None:
    runs = [
        run(start=SINCE - 2 * HOUR, hours=1, lost_gpu_seconds=HOUR),  # ended before the window
        run(start=SINCE + HOUR, hours=1, lost_gpu_seconds=1800),
        run(start=UNTIL - HOUR, hours=None, lost_gpu_seconds=900),  # still running: nothing lost yet
    ]
    (alice,) = report([], runs, SINCE, UNTIL, by_user)
    assert alice.lost_gpu_hours == 0.5


def test_jobs_count_where_submitted_ends_where_they_ended_waits_where_they_first_started() -> None:
    jobs = [
        job(SINCE - HOUR, SINCE + 1, SINCE + HOUR, JobState.SUCCEEDED),
        job(SINCE + 10, SINCE + 70, UNTIL + 1, JobState.FAILED),
        job(SINCE + 20, None, SINCE + 30, JobState.CANCELLED),
        job(SINCE + 40, SINCE + 100, SINCE + 200, JobState.TIMEOUT),
    ]
    (alice,) = report(jobs, [], SINCE, UNTIL, by_user)
    assert alice.jobs == 3, "the first was submitted before the window"
    assert alice.ended == {JobState.SUCCEEDED: 1, JobState.CANCELLED: 1, JobState.TIMEOUT: 1}
    assert sorted(alice.waits) == [60, 60, HOUR + 1]


def test_rows_are_per_user_or_per_group_sorted_by_name() -> None:
    runs = [run("bob"), run("alice"), run("dave", group="nlp", gpus=8)]
    assert [(a.name, a.gpu_hours) for a in report([], runs, SINCE, UNTIL, by_user)] == [
        ("alice", 2), ("bob", 2), ("dave", 8),
    ]  # fmt: skip
    by_groups = report([], runs, SINCE, UNTIL, by_group)
    assert [(a.name, a.gpu_hours) for a in by_groups] == [("nlp", 8), ("vision", 4)]


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([], 50, None),
        ([7.0], 95, 7.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.0),
        ([float(i) for i in range(1, 101)], 95, 95.0),
    ],
)
def test_percentiles_are_nearest_rank(values: list[float], p: float, expected: float | None) -> None:
    assert percentile(values, p) == expected


def test_days_and_daily_gpu_hours_split_a_run_at_utc_midnight() -> None:
    midnight = 20 * DAY
    runs = [run(start=midnight - HOUR, hours=3, gpus=1)]  # 1 h before midnight, 2 h after
    since, until = midnight - 2 * HOUR, midnight + 5 * HOUR
    assert days(since, until) == [midnight - DAY, midnight]
    assert daily_gpu_hours(runs, since, until, by_user) == {"alice": [1.0, 2.0]}


def test_waiting_counts_jobs_submitted_and_neither_started_nor_ended() -> None:
    jobs = [
        job(100, 200, 300, JobState.SUCCEEDED),  # waits 100..200
        job(150, None, 250, JobState.CANCELLED),  # waits 150..250
        job(220, None, None, JobState.PENDING),  # waits from 220 on
    ]
    assert waiting_at(jobs, [50, 100, 160, 200, 240, 250, 1000]) == [0, 1, 2, 1, 2, 1, 1]
