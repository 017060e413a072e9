"""One rule for the stop notice: a stop asked live and the same stop asked again by a restarted server
tell the job the same thing (`spec.stop_order`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import update

from hai_airflow.backends.local.backend import LocalBackend
from hai_airflow.server.control.controller import Controller
from hai_airflow.server.store.tables import LeaseRow
from hai_airflow.spec import StopKind, StopOrder, stop_order
from tests.server.conftest import Api

TOLD = """
import os, pathlib, signal, sys, time
model = pathlib.Path(os.environ["HAI_MODEL_DIR"])
notice = pathlib.Path(os.environ["HAI_PREEMPT_NOTICE"])
run = os.environ["HAI_INSTANCE_ID"]

def told(*args):
    (model / "told.tmp").write_text("notice" if notice.exists() else "no notice")
    os.replace(model / "told.tmp", model / f"told-{run}")
    sys.exit(75)

signal.signal(signal.SIGTERM, told)
(model / f"ready-{run}").write_text("")
time.sleep(60)
"""


class ServerKilled(BaseException):
    """The server process dies: nothing after this point of the controller runs."""


class DiesBeforeStop(LocalBackend):
    """Records nothing of a stop: the server dies after the stop is stored, before the backend acts."""

    def __init__(self, home: Path) -> None:
        super().__init__({"watch_interval_seconds": 0.05}, home)

    def stop(self, instance_id: int, grace_seconds: int, notice: bool) -> None:
        raise ServerKilled


def _model(api: Api, job_id: int) -> Path:
    return api.ctx.home / "jobs" / str(job_id) / "model"


def _running(api: Api, elastic: bool) -> int:
    """A job with a grace of its own, running the script that says what its SIGTERM found."""
    job = api.submit(cmd="python3 told.py", elastic=elastic, grace_seconds=30)
    api.until_state(job["id"], "RUNNING")
    api.until(lambda: any(_model(api, job["id"]).glob("ready-*")), what="the job's script running")
    return int(job["id"])


def _told(api: Api, job_id: int) -> str:
    api.until_state(job_id, "SUSPENDED")
    (told,) = _model(api, job_id).glob("told-*")
    return told.read_text()


def _held(api: Api, elastic: bool) -> str:
    job_id = _running(api, elastic)
    api.post(f"/jobs/{job_id}/suspend", "carol")
    return _told(api, job_id)


def _held_across_a_restart(api: Api, elastic: bool) -> str:
    dying = DiesBeforeStop(api.ctx.home)
    api.controller = Controller(api.ctx, dying)
    job_id = _running(api, elastic)
    api.post(f"/jobs/{job_id}/suspend", "carol")
    with pytest.raises(ServerKilled):
        for _ in range(100):
            api.step()
    dying.close()
    with api.ctx.store.write() as s:  # a killed server never hands its lease back
        s.execute(update(LeaseRow).values(expires_at=0.0))
    api.with_controller()  # the restarted server asks for the stored stop again
    return _told(api, job_id)


@pytest.mark.parametrize(
    ("elastic", "expected"),
    [
        pytest.param(False, "no notice", id="a job that is not elastic is never told to save"),
        pytest.param(True, "notice", id="an elastic job is told to save both ways"),
    ],
)
def test_a_stop_tells_a_job_with_a_grace_the_same_after_a_restart_as_live(
    api: Api, elastic: bool, expected: str
) -> None:
    (api.code / "told.py").write_text(TOLD)
    assert _held_across_a_restart(api, elastic) == expected
    assert _held(api, elastic) == expected  # live, by the restarted server


@pytest.mark.parametrize(
    ("kind", "elastic", "grace", "asked_at", "expected"),
    [
        pytest.param(StopKind.PREEMPT, True, 30, 100.0, StopOrder(30, True), id="elastic preempt: notice"),
        pytest.param(StopKind.PREEMPT, False, 30, 100.0, StopOrder(30, False), id="not elastic: no notice"),
        pytest.param(StopKind.HOLD, True, 0, 100.0, StopOrder(0, True), id="elastic, no grace: notice"),
        pytest.param(StopKind.TIMEOUT, True, 30, 100.0, StopOrder(30, True), id="timeout: notice"),
        pytest.param(StopKind.RESIZE, True, 30, 100.0, StopOrder(30, True), id="resize: notice"),
        pytest.param(StopKind.CANCEL, True, 3, 100.0, StopOrder(3, False), id="cancel: never a notice"),
        pytest.param(StopKind.HOLD, True, 30, 90.0, StopOrder(20, True), id="asked before: what is left"),
        pytest.param(StopKind.HOLD, True, 30, 10.0, StopOrder(0, True), id="grace used up: none left"),
        pytest.param(StopKind.HOLD, True, 30, None, StopOrder(0, True), id="asked when unknown: none"),
    ],
)
def test_stop_order(
    kind: StopKind, elastic: bool, grace: int, asked_at: float | None, expected: StopOrder
) -> None:
    assert stop_order(kind, elastic, grace, asked_at, now=100.0) == expected
