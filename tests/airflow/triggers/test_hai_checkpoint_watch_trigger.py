"""HaiCheckpointWatchTrigger: one event per new checkpoint, against a live server and a training job."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from airflow.triggers.base import BaseEventTrigger

from hai_airflow.assets import checkpoints_in, model_asset, watched_model_asset
from hai_airflow.client import HaiClient
from hai_airflow.spec import StandaloneJobSpec
from hai_airflow.triggers.checkpoint import (
    CheckpointSeen,
    HaiCheckpointEvent,
    HaiCheckpointWatchTrigger,
    is_later,
)
from tests.airflow.helpers import INCLUDE, SERVICE_TOKEN
from tests.support.live_server import LiveServer

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def events_while(
    trigger: BaseEventTrigger, done: Callable[[], bool], linger: float = 3
) -> list[dict[str, Any]]:
    """The trigger's events until `done()` holds and then `linger` seconds more (it never ends itself)."""

    async def collect() -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []

        async def read() -> None:
            async for event in trigger.run():
                events.append(dict(event.payload))

        reader = asyncio.create_task(read())
        while not await asyncio.to_thread(done):
            assert not reader.done(), reader.exception()
            await asyncio.sleep(0.5)
        await asyncio.sleep(linger)
        assert not reader.done(), "a watcher must never end"
        reader.cancel()
        return events

    return asyncio.run(asyncio.wait_for(collect(), 180))


def training(model_dir: Path | None = None, steps: int = 40) -> StandaloneJobSpec:
    """A job that checkpoints every 10 steps, about two seconds apart, and saves `final.pt` at the end."""
    return StandaloneJobSpec(
        task_name="watched",
        code_path=str(INCLUDE),
        cmd=f"python3 train.py --steps {steps} --ckpt-every 10 --keep 20 --step-sleep 0.2",
        resource_pkg=454,
        model_dir=str(model_dir) if model_dir else None,
    )


def ended(client: HaiClient, job_id: int) -> Callable[[], bool]:
    return lambda: client.job(job_id).state == "SUCCEEDED"


def recorded(client: HaiClient, job_id: int) -> list[str]:
    """The checkpoints the server recorded for the job, in order (its `checkpoint` events)."""
    events = client.job(job_id).events
    return [e.reason.removeprefix("latest checkpoint ") for e in events if e.kind == "checkpoint"]


def test_serialize_round_trip() -> None:
    trigger = HaiCheckpointWatchTrigger(
        model_dir="/models/a", hai_conn_id="other", hai_user="alice", poll_interval=5
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "hai_airflow.triggers.checkpoint.HaiCheckpointWatchTrigger"
    assert HaiCheckpointWatchTrigger(**kwargs).serialize() == (classpath, kwargs)
    assert isinstance(trigger, BaseEventTrigger)


@pytest.mark.parametrize(
    "kwargs",
    [pytest.param({}, id="neither"), pytest.param({"job_id": 1, "model_dir": "/m"}, id="both")],
)
def test_watches_exactly_one_thing(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="exactly one of `job_id` and `model_dir`"):
        HaiCheckpointWatchTrigger(**kwargs)


@pytest.mark.parametrize(
    ("seen", "last", "new"),
    [
        pytest.param(CheckpointSeen("a", 1, T0), None, True, id="the first is new"),
        pytest.param(CheckpointSeen("b", 2, T0 + timedelta(1)), CheckpointSeen("a", 1, T0), True, id="later"),
        pytest.param(CheckpointSeen("a", 1, T0), CheckpointSeen("a", 1, T0), False, id="the same one"),
        pytest.param(
            CheckpointSeen("a", 1, T0 + timedelta(1)),
            CheckpointSeen("a", 1, T0),
            True,
            id="rewritten in place",
        ),
        pytest.param(
            CheckpointSeen("a", 1, T0), CheckpointSeen("b", 2, T0 + timedelta(1)), False, id="older"
        ),
    ],
)
def test_is_later(seen: CheckpointSeen, last: CheckpointSeen | None, new: bool) -> None:
    assert is_later(seen, last) is new


def test_one_event_per_new_checkpoint_of_a_job(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn()
    with server.client() as client:
        job = client.submit(training())
        trigger = HaiCheckpointWatchTrigger(job_id=job.id, poll_interval=0.2)
        events = [HaiCheckpointEvent.model_validate(e) for e in events_while(trigger, ended(client, job.id))]
        final = client.job(job.id)
        server_saw = recorded(client, job.id)

    # each checkpoint the server recorded, once and in order, and nothing after the job ended
    assert len(server_saw) >= 3, server_saw
    assert [e.checkpoint for e in events] == server_saw
    assert events[-1].checkpoint == final.latest_checkpoint
    steps = [e.step for e in events if e.step is not None]
    assert steps == sorted(set(steps)) and all(s % 10 == 0 for s in steps)
    assert all(e.status == "found" and e.job_id == job.id and e.saved_at is not None for e in events)


def test_a_model_dir_counts_only_the_jobs_saving_there(
    hai_conn: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = hai_conn()
    watched, other = tmp_path / "watched", tmp_path / "other"
    with server.client() as client:
        mine = client.submit(training(watched, steps=30))
        elsewhere = client.submit(training(other, steps=30))
        trigger = HaiCheckpointWatchTrigger(model_dir=f"{watched}/", poll_interval=0.2)
        raw = events_while(trigger, lambda: ended(client, mine.id)() and ended(client, elsewhere.id)())
        server_saw = recorded(client, mine.id)

    events = [HaiCheckpointEvent.model_validate(e) for e in raw]
    assert [e.checkpoint for e in events] == server_saw and len(server_saw) >= 2
    assert all(e.job_id == mine.id and e.model_dir == f"{watched}/" for e in events)
    assert all(Path(str(e.checkpoint)).parent == watched for e in events)
    # what a DAG scheduled on the asset reads back from the watcher's asset events
    found = checkpoints_in({"from_trigger": True, "payload": e} for e in raw)
    assert [f["checkpoint"] for f in found] == [e.checkpoint for e in events]
    assert [f["step"] for f in found] == [e.step for e in events]


def test_through_a_service_identity_it_watches_as_the_user_named(
    hai_conn: Callable[..., LiveServer],
) -> None:
    server = hai_conn(SERVICE_TOKEN)
    with server.client("alice-token") as alice:
        job = alice.submit(training(steps=20))
        trigger = HaiCheckpointWatchTrigger(job_id=job.id, hai_user="alice", poll_interval=0.2)
        events = events_while(trigger, ended(alice, job.id), linger=1)
        server_saw = recorded(alice, job.id)
    assert [e["checkpoint"] for e in events] == server_saw and len(server_saw) >= 2


def test_a_refusal_is_logged_and_the_watcher_goes_on(
    hai_conn: Callable[..., LiveServer], capfd: pytest.CaptureFixture[str]
) -> None:
    hai_conn()
    trigger = HaiCheckpointWatchTrigger(job_id=999_999, poll_interval=0.2, max_backoff=0.2)
    events = events_while(trigger, lambda: True, linger=1.5)
    assert events == []
    logged = capfd.readouterr().out
    assert "cannot watch hai job 999999, trying again in 0.2 s: task 999999 not found" in logged
    assert logged.count("cannot watch hai job 999999") >= 3, "it must keep trying"


def test_the_watched_asset_is_the_model_dirs() -> None:
    asset = watched_model_asset("/models/a", poll_interval=5)
    plain = model_asset("/models/a")
    assert (asset.name, asset.uri) == (plain.name, plain.uri) == ("hai-model:/models/a", "file:///models/a")
    (watcher,) = asset.watchers
    assert isinstance(watcher.trigger, HaiCheckpointWatchTrigger)
    assert watcher.trigger.serialize()[1]["model_dir"] == "/models/a"
    by_job = watched_model_asset("/models/a", job_id=7).watchers[0].trigger
    assert isinstance(by_job, HaiCheckpointWatchTrigger)
    assert (by_job.job_id, by_job.model_dir) == (7, None)


def test_checkpoints_in_reads_watcher_and_operator_events() -> None:
    extras: list[dict[str, Any]] = [
        {"from_trigger": True, "payload": {"checkpoint": "/m/checkpoint-10.pt", "step": 10, "job_id": 3}},
        {"path": "/m/checkpoint-20.pt", "step": 20},
        {"from_trigger": True, "payload": {"checkpoint": "/m/checkpoint-10.pt", "step": 10, "job_id": 3}},
        {"path": "/m/", "step": None},
        {"from_trigger": True, "payload": {"checkpoint": "/m/final.pt", "step": None, "job_id": 3}},
    ]
    assert checkpoints_in(extras, model_dir="/m") == [
        {"checkpoint": "/m/checkpoint-10.pt", "step": 10, "job_id": 3},
        {"checkpoint": "/m/checkpoint-20.pt", "step": 20, "job_id": None},
        {"checkpoint": "/m/final.pt", "step": None, "job_id": 3},
    ]
