"""The queue's ETA cell: certain estimates first, then the forecast with its source, `~14:20 (history)`;
and the forecast line of `hai task N`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from hai_airflow.cli.output import when
from hai_airflow.cli.queue_cmd import eta
from hai_airflow.cli.task import forecast
from hai_airflow.scheduling.eta import start_estimate
from hai_airflow.spec import ForecastSource, ForecastView, JobDetailView, OtherJobView, QueueEntryView


def today_at_noon() -> datetime:
    """Today, so the cell shows the time alone (read when a test runs: a run may cross midnight)."""
    return datetime.now().astimezone().replace(hour=12, minute=0, second=0, microsecond=0)


SOON = today_at_noon()
"""For the tests that show the time the same way on both sides (`when`)."""
_TODAY = object()
"""`start` of `entry`: today at noon, read when the entry is made."""


def entry(max_schedule: int = 0, reason: str = "needs 8 V100 GPUs; 0 free",
          source: ForecastSource | None = "history",
          start: datetime | object | None = _TODAY) -> QueueEntryView:
    job = OtherJobView(id=3, mode="standalone", state="PENDING", priority="high" if max_schedule else "low",
                       max_schedule=max_schedule, gpus=8, gpu_type="V100", workers=1,
                       submitted_at=datetime.now(UTC))
    at = today_at_noon() if start is _TODAY else start
    assert at is None or isinstance(at, datetime)
    return QueueEntryView(position=1, job=job, weight=0.0, reason=reason,
                          forecast=ForecastView(start_at=at, source=source))


@pytest.mark.parametrize(
    ("made", "cell"),
    [
        pytest.param({}, "~{noon} (history)", id="a forecast shows its time and its source"),
        pytest.param({"source": None}, "~{noon}", id="another user's job: the time only"),
        pytest.param({"start": None}, None, id="a job the forecast did not reach stays unknown"),
        pytest.param({"reason": "starting: fits on node1"}, "now", id="admitted now wins over a forecast"),
    ],
)
def test_eta_cell(made: dict[str, Any], cell: str | None) -> None:
    queued = entry(**made)
    noon = today_at_noon().strftime("%H:%M")
    assert eta(start_estimate(queued, None)) == (cell.format(noon=noon) if cell else cell)


def test_a_high_jobs_promise_wins_over_its_forecast() -> None:
    estimate = start_estimate(entry(max_schedule=4), None)
    assert estimate.kind == "promise"
    assert eta(estimate) is not None and eta(estimate).startswith("by ")  # type: ignore[union-attr]


def test_task_detail_says_the_forecast_in_words() -> None:
    job = JobDetailView(
        id=3, task_name="train", mode="standalone", user="alice", group="vision", state="RUNNING",
        priority="low", max_schedule=0, gpus=8, gpu_type="V100", workers=1, spec={},
        submitted_at=datetime.now(UTC), runtime_seconds=0, preemptions=0, instances=1,
    )
    running = ForecastView(end_at=SOON, suspension_at=SOON, source="user")
    assert forecast(job.model_copy(update={"forecast": running})) == (
        f"ends ~{when(SOON)} (user), may be suspended ~{when(SOON)}"
    )
    waiting = ForecastView(start_at=SOON, source="limit")
    assert forecast(job.model_copy(update={"forecast": waiting})) == f"starts ~{when(SOON)} (limit)"
    unreached = ForecastView(horizon=SOON)
    assert forecast(job.model_copy(update={"forecast": unreached})) == f"not before {when(SOON)}"
    assert forecast(job) is None
