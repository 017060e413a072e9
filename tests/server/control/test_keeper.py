"""The kept cluster state (`server/control/keeper.py`) across a failed step: dropped and read whole
after a fault inside a transaction, kept when only the backend did not answer."""

from __future__ import annotations

import pytest

from hai_airflow.backends.common.base import BackendUnavailable
from tests.server.conftest import Api


def test_after_a_failed_step_the_store_is_read_whole_and_scheduling_goes_on(
    run: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    controller = run.controller
    assert controller is not None
    first = run.submit("alice", cmd="true")
    run.until_state(first["id"], "SUCCEEDED")
    kept = controller.keeper.follower.kept
    assert kept is not None

    def fails() -> list[object]:
        raise RuntimeError("a fault of this step's own")

    monkeypatch.setattr(controller.backend, "poll", fails)
    assert controller.attempt() is False  # logged, not raised
    assert controller.keeper.follower.kept is None  # its rows may be expired: not kept
    monkeypatch.undo()
    second = run.submit("alice", cmd="true")
    run.step()
    assert controller.keeper.follower.kept is not None and controller.keeper.follower.kept is not kept
    run.until_state(second["id"], "SUCCEEDED")


def test_a_backend_that_does_not_answer_is_said_in_one_line_and_waited_out(
    run: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    controller = run.controller
    assert controller is not None
    run.step()
    kept = controller.keeper.follower.kept

    def away() -> list[object]:
        raise BackendUnavailable("the Docker engine on here does not answer")

    monkeypatch.setattr(controller.backend, "poll", away)
    assert controller.attempt() is False
    said = [r for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is None  # one line, no traceback
    assert controller.keeper.follower.kept is kept  # no transaction failed: nothing to read again
    monkeypatch.undo()
    assert controller.attempt() is True
    job = run.submit("alice", cmd="true")
    run.until_state(job["id"], "SUCCEEDED")
