"""Runtime estimates: the order of evidence, the medians, and the time a job has already run."""

from __future__ import annotations

import pytest

from hai_airflow.scheduling.runtime import (
    DEFAULT_RUNTIME_SECONDS,
    MIN_REMAINING_SECONDS,
    FinishedRun,
    RuntimeEstimate,
    RuntimeFacts,
    RuntimeHistory,
    estimate_runtime,
)


def facts(
    limit: int | None = None, run: float = 0.0, user: str = "alice", task: str = "resnet"
) -> RuntimeFacts:
    return RuntimeFacts(job_id=1, user=user, group="vision", task_name=task, time_limit_seconds=limit,
                        seconds_run=run)


def runs(*items: tuple[str, str, str, float]) -> RuntimeHistory:
    """(user, group, task name, seconds), newest first."""
    return RuntimeHistory.of([FinishedRun(u, g, t, s) for u, g, t, s in items])


FULL = runs(
    ("alice", "vision", "resnet", 100),
    ("alice", "vision", "resnet", 300),
    ("alice", "vision", "resnet", 200),
    ("alice", "vision", "bert", 5000), ("bob", "vision", "gpt", 7000), ("carol", "nlp", "t5", 9000),
)


@pytest.mark.parametrize(
    ("job", "history", "expected"),
    [
        pytest.param(facts(limit=900), FULL, RuntimeEstimate(900, 900, "limit"),
                     id="the time limit wins over any history"),
        pytest.param(facts(), FULL, RuntimeEstimate(200, 200, "history"),
                     id="else the median of the same user's runs of the same task name"),
        pytest.param(facts(task="vit"), FULL, RuntimeEstimate(250, 250, "user"),
                     id="else the median of the user's runs"),
        pytest.param(facts(user="dave", task="vit"), FULL, RuntimeEstimate(300, 300, "group"),
                     id="else the median of the group's runs"),
        pytest.param(facts(user="erin"), runs(("carol", "nlp", "t5", 9000), ("frank", "nlp", "t5", 1000)),
                     RuntimeEstimate(5000, 5000, "cluster"), id="else the median of the cluster's runs"),
        pytest.param(facts(), RuntimeHistory(),
                     RuntimeEstimate(DEFAULT_RUNTIME_SECONDS, DEFAULT_RUNTIME_SECONDS, "cluster"),
                     id="a cluster with no finished job falls back to the default"),
        pytest.param(facts(run=50), FULL, RuntimeEstimate(200, 150, "history"),
                     id="the time already run (over all runs) is taken off"),
        pytest.param(facts(run=1000), FULL, RuntimeEstimate(200, MIN_REMAINING_SECONDS, "history"),
                     id="a job past its median runs at least a minimum longer"),
        pytest.param(facts(limit=900, run=600), FULL, RuntimeEstimate(900, 300, "limit"),
                     id="a limited job has only what its limit leaves"),
        pytest.param(facts(limit=900, run=950), FULL, RuntimeEstimate(900, 0, "limit"),
                     id="a job past its limit is being stopped: nothing left"),
    ],
)
def test_estimate_order(job: RuntimeFacts, history: RuntimeHistory, expected: RuntimeEstimate) -> None:
    assert estimate_runtime(job, history) == expected


def test_history_keeps_the_newest_runs_of_each_kind() -> None:
    newest_first = [FinishedRun("alice", "vision", "resnet", float(s)) for s in (100, 200, 300, 9000, 9000)]
    history = RuntimeHistory.of(newest_first, keep=3)
    assert history.by_task[("alice", "resnet")] == (100, 200, 300)
    assert history.by_user["alice"] == (100, 200, 300)
    assert history.by_group["vision"] == (100, 200, 300)
    assert history.cluster == (100, 200, 300)
    assert estimate_runtime(facts(), history) == RuntimeEstimate(200, 200, "history")
