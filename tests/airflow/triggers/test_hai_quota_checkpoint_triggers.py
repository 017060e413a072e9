"""HaiQuotaTrigger and HaiCheckpointTrigger against a live server and a real directory."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from airflow.triggers.base import BaseTrigger

from hai_airflow.spec import CpuJobSpec, StandaloneJobSpec
from hai_airflow.triggers.checkpoint import (
    CheckpointSeen,
    HaiCheckpointEvent,
    HaiCheckpointTrigger,
    checkpoint_step,
    is_newer,
    newest_in_path,
)
from hai_airflow.triggers.quota import HaiQuotaEvent, HaiQuotaTrigger
from tests.airflow.helpers import INCLUDE
from tests.support.live_server import LiveServer

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def first_event(trigger: BaseTrigger, timeout: float = 60) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(run(), timeout))


def test_quota_trigger_fires_once_the_quota_frees(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn("alice-token")
    with server.client("alice-token") as alice:
        blocker = alice.submit(
            StandaloneJobSpec(
                task_name="blocker", code_path="/tmp", cmd="sleep 4", resource_pkg=457, max_schedule=4
            )
        )
        assert alice.check_high_priority(1)["allowed"] is False
        started = time.monotonic()
        event = HaiQuotaEvent.model_validate(first_event(HaiQuotaTrigger(1, poll_interval=0.5)))
        waited = time.monotonic() - started
        assert alice.job(blocker.id).state == "SUCCEEDED"
    assert event.status == "allowed" and event.gpus == 1
    assert waited >= 2, "fired before the blocking job ended"


@pytest.mark.parametrize(
    ("name", "step"),
    [
        pytest.param("checkpoint-00000120.pt", 120, id="training helper name"),
        pytest.param("epoch7.ckpt", 7, id="number inside the name"),
        pytest.param("model-v2-step300.tar.gz", 300, id="last number before the suffixes"),
        pytest.param("final.pt", None, id="no number"),
    ],
)
def test_checkpoint_step_from_the_name(name: str, step: int | None) -> None:
    assert checkpoint_step(f"/models/{name}") == step


@pytest.mark.parametrize(
    ("seen", "newer_than", "after_step", "counts"),
    [
        pytest.param(CheckpointSeen("c", 20, T0), None, None, True, id="no marks: any checkpoint"),
        pytest.param(CheckpointSeen("c", 20, T0), None, 10, True, id="past the step"),
        pytest.param(CheckpointSeen("c", 10, T0), None, 10, False, id="at the step is not past it"),
        pytest.param(
            CheckpointSeen("c", None, T0), None, 10, False, id="unknown step never counts for a step"
        ),
        pytest.param(
            CheckpointSeen("c", 20, T0), T0 - timedelta(seconds=1), None, True, id="newer than the time"
        ),
        pytest.param(CheckpointSeen("c", 20, T0), T0, None, False, id="same time is not newer"),
        pytest.param(CheckpointSeen("c", 20, T0), T0 - timedelta(1), 30, False, id="both marks must hold"),
    ],
)
def test_is_newer(
    seen: CheckpointSeen, newer_than: datetime | None, after_step: int | None, counts: bool
) -> None:
    assert is_newer(seen, newer_than, after_step) is counts


def test_newest_in_path_skips_unfinished_files(tmp_path: Path) -> None:
    for name in (
        "checkpoint-00000010.pt",
        "checkpoint-00000020.pkl",
        ".checkpoint-00000030.tmp-99",
        "notes.txt",
    ):
        (tmp_path / name).write_bytes(b"x")
    seen = newest_in_path(str(tmp_path))
    assert seen is not None and (Path(seen.path).name, seen.step) == ("checkpoint-00000020.pkl", 20)
    assert newest_in_path(str(tmp_path / "checkpoint-00000010.pt")).step == 10  # type: ignore[union-attr]
    assert newest_in_path(str(tmp_path / "missing")) is None


def test_checkpoint_trigger_on_a_path_waits_for_a_newer_step(tmp_path: Path) -> None:
    (tmp_path / "checkpoint-00000010.pt").write_bytes(b"old")

    def write_later() -> None:
        time.sleep(1.5)
        temp = tmp_path / ".checkpoint-00000020.tmp-1"
        temp.write_bytes(b"new")
        os.replace(temp, tmp_path / "checkpoint-00000020.pt")

    writer = threading.Thread(target=write_later)
    writer.start()
    event = HaiCheckpointEvent.model_validate(
        first_event(HaiCheckpointTrigger(path=str(tmp_path), after_step=10, poll_interval=0.3))
    )
    writer.join()
    assert (event.status, event.step) == ("found", 20)
    assert event.checkpoint == str(tmp_path / "checkpoint-00000020.pt")


def test_checkpoint_trigger_on_a_job(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn()
    with server.client() as client:
        job = client.submit(
            StandaloneJobSpec(
                task_name="ckpt",
                code_path=str(INCLUDE),
                cmd="python3 train.py --steps 40 --ckpt-every 10 --step-sleep 0.1",
                resource_pkg=454,
            )
        )
        event = HaiCheckpointEvent.model_validate(
            first_event(HaiCheckpointTrigger(job_id=job.id, after_step=15, poll_interval=0.5), 90)
        )
        assert event.status == "found" and event.job_id == job.id
        assert event.step is not None and event.step > 15 and event.step % 10 == 0
        assert event.saved_at is not None

        quick = client.submit(CpuJobSpec(task_name="no-ckpt", code_path="/tmp", cmd="sleep 1"))
        ended = HaiCheckpointEvent.model_validate(
            first_event(HaiCheckpointTrigger(job_id=quick.id, poll_interval=0.5))
        )
        assert (ended.status, ended.job_state) == ("job_ended", "SUCCEEDED")
