"""`--after <array id>` waits for every task of the array, as Slurm's afterok on an array job does: the
dependent starts only once all of them succeeded, and is cancelled, as after a failed single task,
when one of them fails."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.security.cli import hai
from tests.support.live_cli import hai_ok as _run
from tests.support.live_cli import module_server  # noqa: F401 (the fixture `server`)
from tests.support.live_server import LiveServer

ELEMENT = """\
import os, pathlib, sys, time
index = int(os.environ["HAI_ARRAY_INDEX"])
if index == 1:  # the array's second task runs until the test lets it end, or fails
    deadline = time.monotonic() + 120
    while not pathlib.Path("go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(1 if pathlib.Path("fail").exists() else 0)
"""


def _created(out: str) -> list[int]:
    return [int(line.split()[2]) for line in out.splitlines() if line.startswith("created task ")]


def _submit(server: LiveServer, code: Path, cmd: str, *flags: str) -> list[int]:
    return _created(_run(server, "submit", "cpu", "--name=arr", f"--code-dir={code}", *flags, cmd))


def _state(server: LiveServer, task: int) -> dict[str, object]:
    detail: dict[str, object] = json.loads(_run(server, "task", str(task), "-o", "json"))
    return detail


def _wait(server: LiveServer, task: int, *states: str) -> str:
    return _run(server, "wait", str(task), "--for", ",".join(states), "--timeout", "60")


@pytest.fixture
def code(tmp_path: Path) -> Path:
    (tmp_path / "element.py").write_text(ELEMENT, encoding="utf-8")
    return tmp_path


def _array_and_dependent(server: LiveServer, code: Path) -> tuple[list[int], int, int]:
    """An array of 3 whose second task waits for `go`, a task after the whole array, and a witness
    after the third task alone: once the witness is released, the controller has seen tasks 1 and 3
    end."""
    first = _submit(server, code, f"{sys.executable} element.py", "--array=0-2")[0]
    listed = json.loads(_run(server, "task", "--array", str(first), "--json"))
    elements = sorted(j["id"] for j in listed)
    assert len(elements) == 3 and elements[0] == first, elements
    (dependent,) = _submit(
        server, code, f"{sys.executable} -c \"print('dependent ran')\"", f"--after={first}"
    )
    (witness,) = _submit(server, code, f"{sys.executable} -c pass", f"--after={elements[2]}")
    for task in (elements[0], elements[2], witness):
        assert "SUCCEEDED" in _wait(server, task, "SUCCEEDED"), task
    return elements, dependent, witness


def test_a_task_after_an_array_starts_only_when_every_task_succeeded(server: LiveServer, code: Path) -> None:
    elements, dependent, _ = _array_and_dependent(server, code)
    waiting = _state(server, dependent)
    assert waiting["state"] == "PENDING" and _state(server, elements[1])["state"] == "RUNNING"
    assert f"every task of array {elements[0]}" in str(waiting["reason"]), waiting["reason"]

    (code / "go").write_text("")
    assert "SUCCEEDED" in _wait(server, dependent, "SUCCEEDED")
    assert "dependent ran" in _run(server, "log", str(dependent), "--tail", "0")
    ended = _state(server, elements[1])["ended_at"]
    started = [e for e in _state(server, dependent)["events"] if e["kind"] == "released"]  # type: ignore[union-attr]
    assert started and started[0]["at"] >= ended, "released only after the last task ended"


def test_a_task_after_an_array_with_a_failed_task_is_cancelled(server: LiveServer, code: Path) -> None:
    (code / "fail").write_text("")
    elements, dependent, _ = _array_and_dependent(server, code)
    (code / "go").write_text("")
    assert "CANCELLED" in _wait(server, dependent, "CANCELLED")
    reason = str(_state(server, dependent)["reason"])
    assert f"task {elements[1]} of array {elements[0]} ended FAILED" in reason, reason

    # A task submitted after the array now is refused at once, as after a failed single task.
    late = hai(server, "alice", "submit", "cpu", "--name=late", f"--code-dir={code}",
               f"--after={elements[0]}", f"{sys.executable} -c pass")  # fmt: skip
    assert late.returncode == 2, late.stdout + late.stderr
    assert f"task {elements[1]} of array {elements[0]} already ended FAILED" in late.stderr, late.stderr


def test_another_user_may_not_wait_for_the_array(server: LiveServer, code: Path) -> None:
    (first, *_) = _submit(server, code, f"{sys.executable} -c pass", "--array=0-2")
    refused = hai(server, "dave", "submit", "cpu", "--name=x", f"--code-dir={code}", f"--after={first}",
                  f"{sys.executable} -c pass")  # fmt: skip
    assert refused.returncode == 2 and "not found" in refused.stderr, refused.stderr
