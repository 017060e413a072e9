"""Any complete file a job writes under its model dir is its progress: the platform document's own
pattern (one path of the job's choosing, `model_latest.pth`) is shown by `hai task` and the dashboard,
given to the resumed instance as HAI_LATEST_CHECKPOINT, named by the resume event and counted by
`hai usage`, all from the one recorded latest checkpoint; a save in progress (a temp name, a dotfile)
is not progress. Real `hai serve`, real CLI, loopback only."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from dev.demo.story import trainer_loaded
from tests.support.live_cli import (
    hai_ok,
    module_server,  # noqa: F401 (the fixture `server`)
)
from tests.support.live_server import TOKENS, LiveServer

PLAIN = """\
import os, pathlib, sys, time
model = pathlib.Path(os.environ["HAI_MODEL_DIR"])
ckpt = model / "model_latest.pth"
print("HAI_LATEST_CHECKPOINT=" + os.environ.get("HAI_LATEST_CHECKPOINT", ""), flush=True)
step = int(ckpt.read_bytes()) if ckpt.exists() else 0
print(f"resumed from step {step}", flush=True)
if step:
    sys.exit(0)
time.sleep(1.5)  # work before the first save: kept when the job is suspended
tmp = model / "model_latest.pth.tmp"
tmp.write_bytes(b"1")
os.replace(tmp, ckpt)
# The next saves, in progress: newer than the checkpoint, yet not progress.
(model / "model_latest.pth.tmp").write_bytes(b"2, half written")
(model / ".model_latest.pth.swp").write_bytes(b"2, half written")
print("saved step 1", flush=True)
time.sleep(120)
"""
"""The platform document's 单机训练 pattern without torch: one path of its own, loaded at start."""

SKEWED = """\
import os, pathlib, sys, time
model = pathlib.Path(os.environ["HAI_MODEL_DIR"])
saved = sorted(model.glob("step-*.pt"), key=lambda p: p.stat().st_mtime)
if saved:
    print(f"resumed from {saved[-1]}", flush=True)
    sys.exit(0)
for step in range(1, 1200):
    tmp = model / "step.tmp"
    tmp.write_bytes(str(step).encode())
    ahead = time.time() + 3600 + step  # the file server's clock runs an hour ahead of hai serve's
    os.utime(tmp, (ahead, ahead))
    os.replace(tmp, model / f"step-{step:04d}.pt")
    if step == 1:
        print("saved step 1", flush=True)
    time.sleep(0.1)
"""
"""Saves every 0.1 s on a model dir whose mtimes run ahead of the server's clock (a NAS's), and
resumes, as the demo's trainer does, from the newest file there."""


def created(out: str) -> int:
    return int(out.split("created task ")[1].split()[0])


def task(server: LiveServer, job: int, user: str = "alice") -> dict[str, Any]:
    detail: dict[str, Any] = json.loads(hai_ok(server, "task", str(job), "-o", "json", user=user))
    return detail


def wait_for(what: str, check: Any, timeout: float = 30.0) -> Any:
    """Poll `check()` until it returns something truthy, within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return found


def submit(server: LiveServer, code: Path, user: str, name: str, cmd: str, high: bool = False) -> int:
    args = ["create", "--task-name", name, "--resource-pkg", "457", "--code-path", str(code)]
    args += ["--max-schedule", "4" if high else "0", "--cmd", cmd]
    return created(hai_ok(server, *args, user=user))


def preempt(server: LiveServer, code: Path, low: int, user: str) -> None:
    """A high-priority job for the whole node suspends `low`, runs, and `low` resumes and ends."""
    urgent = submit(server, code, "dave", "urgent", f"{sys.executable} -c pass", high=True)
    wait_for("the suspension", lambda: task(server, low, user)["preemptions"] >= 1)
    assert "SUCCEEDED" in hai_ok(server, "wait", str(urgent), user="dave")
    assert "SUCCEEDED" in hai_ok(server, "wait", str(low), user=user)


def seconds(at: str) -> float:
    return datetime.fromisoformat(at).timestamp()


@pytest.fixture
def code(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(PLAIN, encoding="utf-8")
    (tmp_path / "skewed.py").write_text(SKEWED, encoding="utf-8")
    return tmp_path


def test_model_latest_pth_is_the_progress_every_view_and_the_resumed_job_agree_on(
    server: LiveServer, code: Path
) -> None:
    low = submit(server, code, "alice", "plain", f"{sys.executable} train.py")
    path = f"{server.home}/jobs/{low}/model/model_latest.pth"
    # Seen while it runs, though the half-written saves (a temp name, a dotfile) are newer.
    assert wait_for("the checkpoint", lambda: task(server, low)["latest_checkpoint"]) == path
    preempt(server, code, low, "alice")

    first, second = json.loads(hai_ok(server, "instance", "--task-id", str(low), "--json"))
    assert first["end_reason"] == "preempted"
    assert second["resume"] is True and second["checkpoint"] == path
    log = hai_ok(server, "log", "--instance-id", str(second["id"]), "--tail", "0")
    assert f"HAI_LATEST_CHECKPOINT={path}\n" in log and "resumed from step 1" in log, log
    detail = task(server, low)
    assert detail["latest_checkpoint"] == path
    assert any(e["reason"] == f"instance {second['id']} resumed from {path}" for e in detail["events"])
    assert path in hai_ok(server, "task", str(low))
    page = httpx.get(f"{server.url}/ui/jobs/{low}", headers={"Authorization": f"Bearer {TOKENS['alice']}"})
    assert page.status_code == 200 and path in page.text

    # Lost work is the run past the checkpoint, not the whole first run (>= 1.5 s x 8 GPUs kept).
    (usage,) = json.loads(hai_ok(server, "usage", "--user", "alice", "-o", "json"))
    whole = (seconds(first["ended_at"]) - seconds(first["started_at"])) * 8 / 3600
    assert usage["lost_gpu_hours"] < whole - 8 / 3600, (usage, whole)


def test_the_resume_event_names_the_file_the_job_resumed_from(server: LiveServer, code: Path) -> None:
    """The demo's `checkpoint-00000020.pt` event beside `resumed from step 30`: the save finished
    after the kill request (by the server's clock) was complete, yet left out, so the event and
    HAI_LATEST_CHECKPOINT named an older file than the one the job loaded."""
    low = submit(server, code, "bob", "skewed", f"{sys.executable} skewed.py")
    wait_for("the first save", lambda: task(server, low, "bob")["latest_checkpoint"], timeout=30)
    preempt(server, code, low, "bob")

    second = json.loads(hai_ok(server, "instance", "--task-id", str(low), "--json", user="bob"))[-1]
    log = hai_ok(server, "log", "--instance-id", str(second["id"]), "--tail", "0", user="bob")
    loaded = log.split("resumed from ")[1].split()[0]
    assert second["checkpoint"] == loaded, log
    assert task(server, low, "bob")["latest_checkpoint"] == loaded


def test_the_demo_reads_which_checkpoint_its_trainer_loaded() -> None:
    log = "HAI_RESUME=1\nresumed from step 30 (checkpoint-00000030.pt)\nstep 31\n"
    assert trainer_loaded(log) == "checkpoint-00000030.pt"
    assert trainer_loaded("first start\n") is None
