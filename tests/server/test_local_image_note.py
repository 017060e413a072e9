"""`--image X` on the local backend: the job runs on this machine with the server's Python, and its
task says so (an event at start, shown by `hai task N`) instead of recording X as if it were used."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.support.live_cli import (
    hai_ok,
    module_server,  # noqa: F401 (the fixture `server`)
)
from tests.support.live_server import LiveServer

NOTE = "the local backend runs commands on this machine; image {} is not used"


def _task(server: LiveServer, code: Path, *flags: str) -> int:
    out = hai_ok(server, "submit", "cpu", "--name=img", f"--code-dir={code}", "--wait", *flags,
                 f"{sys.executable} -c pass")  # fmt: skip
    return int(out.split("created task ")[1].split()[0])


def test_a_local_job_naming_an_image_says_the_image_is_not_used(server: LiveServer, tmp_path: Path) -> None:
    task = _task(server, tmp_path, "--image=pytorch/pytorch:2.1.0")
    note = NOTE.format("pytorch/pytorch:2.1.0")
    shown = " ".join(hai_ok(server, "task", str(task)).split())
    assert "is not used" in shown and "pytorch/pytorch:2.1.0" in shown, shown
    events = json.loads(hai_ok(server, "task", str(task), "-o", "json"))["events"]
    assert [e["kind"] for e in events if e["reason"] == note] == ["note"], events


def test_a_local_job_with_the_default_image_has_no_such_note(server: LiveServer, tmp_path: Path) -> None:
    events = json.loads(hai_ok(server, "task", str(_task(server, tmp_path)), "-o", "json"))["events"]
    assert not [e for e in events if "is not used" in e["reason"]], events
