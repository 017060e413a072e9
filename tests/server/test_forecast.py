"""Forecasts in the server: recent runtimes from the store, the forecaster thread beside the controller,
and what the queue and the job view show of a forecast (another user's job: the time only)."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from hai_airflow.scheduling.model import Snapshot, Wait
from hai_airflow.scheduling.runtime import RuntimeHistory
from hai_airflow.server.control.forecaster import Forecaster
from hai_airflow.server.jobs.queue_forecast import GRAIN_SECONDS, Offer, QueueForecast
from hai_airflow.server.jobs.runtime_history import recent_runs
from tests.scheduling.builders import job
from tests.server.conftest import Api


def _entry(api: Api, user: str, job_id: int) -> dict:
    r = api.get("/queue", user)
    assert r.status_code == 200, r.text
    return next(e for e in r.json() if e["job"]["id"] == job_id)


def _at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_recent_runs_are_successes_among_the_newest_ended(api: Api) -> None:
    api.with_controller()
    for cmd in ("true", "true", "false"):
        ran = api.submit("alice", task_name="quick", cmd=cmd)
        api.until_state(ran["id"], "SUCCEEDED", "FAILED")
    with api.ctx.store.read() as s:
        runs = recent_runs(s)
        newest_two = recent_runs(s, limit=2)
    assert [(r.user, r.group, r.task_name) for r in runs] == [("alice", "vision", "quick")] * 2
    assert len(newest_two) == 1  # the failure is the newest ended job and does not count


def test_queue_and_job_views_show_the_forecast_masked_for_others(api: Api) -> None:
    controller = api.with_controller()
    first = api.submit("alice", task_name="train", cmd="sleep 60", resource_pkg=457, time_limit_seconds=3600)
    api.until_state(first["id"], "RUNNING")
    second = api.submit("dave", task_name="eval", resource_pkg=457)
    api.step()
    controller.forecaster.refresh()
    assert api.ctx.forecast is not None

    # It starts when alice's job reaches its time limit at the latest; that limit is alice's to know:
    # dave sees neither the source nor the exact time, only the quarter-hour.
    own = _entry(api, "dave", second["id"])["forecast"]
    assert own["source"] is None
    assert _at(own["start_at"]) % GRAIN_SECONDS == 0
    assert time.time() + 3500 < _at(own["start_at"]) <= time.time() + 3600 + GRAIN_SECONDS

    other = _entry(api, "alice", second["id"])
    assert other["job"]["visibility"] == "other"
    assert time.time() + 3500 < _at(other["forecast"]["start_at"]) <= _at(own["start_at"])
    assert {k for k, v in other["forecast"].items() if v is not None} == {"start_at", "horizon", "at"}

    # A job that waits anyway on a settled cluster is not planned, yet it is forecast too.
    assert controller.settled is not None
    third = api.submit("bob", task_name="more", resource_pkg=457)
    api.step()
    assert controller.settled is not None
    controller.forecaster.refresh()
    assert _entry(api, "bob", third["id"])["forecast"]["start_at"] is not None

    running = api.job(first["id"], "alice")["forecast"]
    assert running["source"] == "limit" and running["start_at"] is None
    assert _at(running["end_at"]) == pytest.approx(_at(other["forecast"]["start_at"]), abs=1)


def test_a_failing_forecaster_never_stops_scheduling(api: Api) -> None:
    controller = api.with_controller()

    def broken(offer: Offer, history: RuntimeHistory) -> QueueForecast:
        raise RuntimeError("forecast broke")

    controller.forecaster.compute = broken
    controller.forecaster.refresh_seconds = 0.01
    controller.forecaster.start()
    first = api.submit("alice", resource_pkg=457, cmd="sleep 60")
    api.until_state(first["id"], "RUNNING")
    api.submit("bob", resource_pkg=457)
    api.until(lambda: controller.forecaster.failures > 0, what="the forecaster to fail")

    def refusing(*planned: object) -> None:
        raise RuntimeError("offer broke")

    controller.forecaster.offer = refusing  # type: ignore[method-assign]
    api.post(f"/jobs/{first['id']}/cancel", "alice")
    third = api.submit("alice", cmd="true")
    api.until_state(third["id"], "SUCCEEDED")
    latest = api.ctx.forecast
    assert latest is None or not latest.jobs  # no forecast of a waiting job was ever made


def test_the_forecaster_thread_refreshes_after_an_offer_and_survives_failures(api: Api) -> None:
    made: list[Offer] = []

    def compute(offer: Offer, history: RuntimeHistory) -> QueueForecast:
        made.append(offer)
        if len(made) == 1:
            raise RuntimeError("first forecast broke")
        return QueueForecast(at=offer.at)

    forecaster = Forecaster(api.ctx.store, refresh_seconds=0.01, compute=compute)
    forecaster.start()
    try:
        waiting = Snapshot(nodes=(), jobs=(job(1).build(),))
        forecaster.offer(waiting, {}, {}, [Wait(1, "needs 1 V100 GPU", 1)])
        deadline = time.monotonic() + 5
        while forecaster.failures == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        forecaster.offer(waiting, {}, {}, [Wait(1, "needs 1 V100 GPU", 1)])
        while forecaster.latest is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        forecaster.stop()
    assert forecaster.failures == 1
    assert forecaster.latest is not None and len(made) == 2
