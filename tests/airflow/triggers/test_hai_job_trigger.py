"""HaiJobTrigger against a live server: events, long-poll (not tight polling), reconnects, on_kill."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from airflow.triggers.base import BaseTrigger

from hai_airflow.client import AsyncHaiClient, HaiUnreachable
from hai_airflow.hooks.follower import HaiJobEvent, describe_forecast
from hai_airflow.spec import CpuJobSpec, ForecastView, JobView, StandaloneJobSpec
from hai_airflow.triggers.checkpoint import HaiCheckpointTrigger
from hai_airflow.triggers.job import HaiJobTrigger
from hai_airflow.triggers.quota import HaiQuotaTrigger
from tests.airflow.helpers import wait_for
from tests.support.live_server import LiveServer


def first_event(trigger: BaseTrigger, timeout: float = 60) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(run(), timeout))


def submit(server: LiveServer, cmd: str) -> JobView:
    with server.client() as client:
        return client.submit(CpuJobSpec(task_name="trigger-test", code_path="/tmp", cmd=cmd))


@pytest.mark.parametrize(
    "trigger",
    [
        pytest.param(
            HaiJobTrigger(
                7,
                "hai_x",
                target_states=["RUNNING"],
                poll_timeout=12,
                log_tail_lines=5,
                cancel_on_kill=False,
                on_behalf_of="alice",
            ),
            id="job",
        ),
        pytest.param(HaiQuotaTrigger(8, "hai_x", poll_interval=3, on_behalf_of="bob"), id="quota"),
        pytest.param(
            HaiCheckpointTrigger(job_id=3, newer_than="2026-01-02T03:04:05", after_step=40, poll_interval=2),
            id="checkpoint of a job",
        ),
        pytest.param(HaiCheckpointTrigger(path="/data/ckpt", pattern="*.pt"), id="checkpoint in a path"),
    ],
)
def test_serialize_round_trip(trigger: BaseTrigger) -> None:
    from airflow.sdk.module_loading import import_string

    classpath, kwargs = trigger.serialize()
    json.dumps(kwargs)  # what the triggerer table stores
    rebuilt = import_string(classpath)(**kwargs)
    assert type(rebuilt) is type(trigger)
    assert rebuilt.serialize() == (classpath, kwargs)


def test_success_event_carries_the_result_and_log_tail(hai_conn: Callable[..., LiveServer]) -> None:
    job = submit(hai_conn(), "echo first; sleep 1; echo last")
    event = HaiJobEvent.model_validate(first_event(HaiJobTrigger(job.id, log_tail_lines=1)))
    assert event.status == "success" and event.state == "SUCCEEDED"
    assert (event.job_id, event.instances, event.preemptions) == (job.id, 1, 0)
    assert event.log_tail == ("last",)


def test_failed_event_carries_the_reason(hai_conn: Callable[..., LiveServer]) -> None:
    job = submit(hai_conn(), "echo boom; exit 3")
    event = HaiJobEvent.model_validate(first_event(HaiJobTrigger(job.id)))
    assert event.status == "failed" and event.state == "FAILED"
    assert "3" in (event.reason or "") and "boom" in event.log_tail


def test_a_job_out_of_time_is_a_timeout_event_with_the_reason(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn()
    with server.client() as client:
        job = client.submit(
            CpuJobSpec(task_name="trigger-test", code_path="/tmp", cmd="sleep 30", time_limit_seconds=1)
        )
    event = HaiJobEvent.model_validate(first_event(HaiJobTrigger(job.id)))
    assert (event.status, event.state) == ("timeout", "TIMEOUT")
    assert (event.reason or "").startswith("reached its time limit of 1s")


def test_target_state_is_reached_before_the_end(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn()
    job = submit(server, "sleep 30")
    event = HaiJobEvent.model_validate(first_event(HaiJobTrigger(job.id, target_states=["RUNNING"])))
    assert (event.status, event.state) == ("reached", "RUNNING")


def test_unknown_job_is_an_error_event(hai_conn: Callable[..., LiveServer]) -> None:
    hai_conn()
    event = HaiJobEvent.model_validate(first_event(HaiJobTrigger(999)))
    assert event.status == "error" and "999" in event.message


def test_waits_with_the_long_poll_not_a_tight_loop(
    hai_conn: Callable[..., LiveServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str | None] = []
    original = AsyncHaiClient.wait

    async def counted(
        self: AsyncHaiClient, job_id: int, since_state: str | None = None, timeout: float = 30
    ) -> JobView:
        calls.append(since_state)
        return await original(self, job_id, since_state, timeout)

    monkeypatch.setattr(AsyncHaiClient, "wait", counted)
    job = submit(hai_conn(), "sleep 4")
    event = first_event(HaiJobTrigger(job.id, poll_timeout=30))
    assert event["status"] == "success"
    # one call to learn the state, then one per state change (PENDING/STARTING -> RUNNING -> SUCCEEDED)
    assert len(calls) <= 5, calls


def test_reconnects_when_the_server_crashes_and_restarts(
    hai_conn: Callable[..., LiveServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = hai_conn()
    job = submit(server, "sleep 6; echo survived")
    with server.client() as client:
        wait_for(client, job.id, lambda j: j.state == "RUNNING")
    unreachable: list[float] = []
    original = AsyncHaiClient.wait

    async def watched(
        self: AsyncHaiClient, job_id: int, since_state: str | None = None, timeout: float = 30
    ) -> JobView:
        try:
            return await original(self, job_id, since_state, timeout)
        except HaiUnreachable:
            unreachable.append(time.monotonic())
            raise

    monkeypatch.setattr(AsyncHaiClient, "wait", watched)

    def crash_and_restart() -> None:
        time.sleep(1)
        server.kill9()  # its jobs keep running, as after a crash
        time.sleep(3)
        server.start()

    bouncer = threading.Thread(target=crash_and_restart)
    bouncer.start()
    event = HaiJobEvent.model_validate(first_event(HaiJobTrigger(job.id, poll_timeout=20, max_backoff=2), 90))
    bouncer.join()
    assert event.status == "success" and event.log_tail[-1] == "survived"
    assert len(unreachable) >= 2, "the trigger never saw the server down"
    # backoff: the retries were spread out, not a tight loop
    assert unreachable[-1] - unreachable[0] >= 1.0


def test_on_kill_cancels_the_job_unless_told_not_to(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn()
    kept, killed = submit(server, "sleep 60"), submit(server, "sleep 60")
    asyncio.run(HaiJobTrigger(kept.id, cancel_on_kill=False).on_kill())
    asyncio.run(HaiJobTrigger(killed.id).on_kill())
    with server.client() as client:
        assert wait_for(client, killed.id, lambda j: j.state == "CANCELLED").state == "CANCELLED"
        assert client.job(kept.id).state not in ("CANCELLED", "SUCCEEDED", "FAILED")


def test_a_waiting_job_s_forecast_start_is_logged_when_it_is_news(
    hai_conn: Callable[..., LiveServer], capsys: pytest.CaptureFixture[str]
) -> None:
    server = hai_conn()
    with server.client() as admin:
        spec = {"code_path": "/tmp", "cmd": "sleep 120", "resource_pkg": 457, "max_schedule": 0}
        first = admin.submit(StandaloneJobSpec(task_name="holds-all-gpus", time_limit_seconds=3600, **spec))
        wait_for(admin, first.id, lambda j: j.state == "RUNNING")
        second = admin.submit(StandaloneJobSpec(task_name="waits", **spec))

    async def follow_a_while() -> None:  # the job waits an hour: the trigger is stopped long before
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(first_event_async(HaiJobTrigger(second.id, poll_timeout=1)), 15)

    asyncio.run(follow_a_while())
    logged = capsys.readouterr().out + capsys.readouterr().err
    lines = [line for line in logged.splitlines() if "expected to start" in line]
    assert len(lines) == 1, logged  # said once, while it does not move
    said = re.search(r"hai job (\d+): expected to start around (\S+ \S+) UTC, estimated from (\w+)", lines[0])
    assert said is not None, lines
    assert (int(said[1]), said[3]) == (second.id, "limit")  # the running job's time limit
    start = datetime.strptime(said[2], "%Y-%m-%d %H:%M").replace(tzinfo=UTC).timestamp()
    assert time.time() + 3400 < start <= time.time() + 3600


async def first_event_async(trigger: BaseTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return dict(event.payload)
    raise AssertionError("the trigger ended without an event")


def test_describe_forecast_says_news_only() -> None:
    at = datetime(2026, 12, 6, 14, 20, tzinfo=UTC)
    forecast = ForecastView(start_at=at, source="history")
    line, said = describe_forecast(7, forecast, None) or ("", None)
    assert line == "hai job 7: expected to start around 2026-12-06 14:20 UTC, estimated from history"
    assert describe_forecast(7, forecast, said) is None
    assert (
        describe_forecast(7, ForecastView(start_at=at + timedelta(minutes=4), source="history"), said) is None
    )
    moved = describe_forecast(7, ForecastView(start_at=at + timedelta(minutes=6), source="history"), said)
    assert moved is not None and "14:26 UTC" in moved[0]
    assert describe_forecast(7, ForecastView(start_at=at, source="limit"), said) is not None
    none_yet = describe_forecast(7, ForecastView(horizon=at), None)
    assert none_yet is not None and none_yet[0].startswith("hai job 7: no start expected yet")
    assert describe_forecast(7, None, said) is None
