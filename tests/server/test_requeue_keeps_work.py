"""`hai requeue N` keeps N's work: the new task's model dir holds N's files (carried over as hard
links), so a job that loads its own checkpoint from `$HAI_MODEL_DIR` goes on where N stopped, while N
keeps its files as they were; `--fresh` starts with an empty model dir at step 0."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.security.cli import hai
from tests.support.live_cli import hai_ok as _run
from tests.support.live_cli import module_server  # noqa: F401 (the fixture `server`)
from tests.support.live_server import LiveServer

TRAIN = """\
import os, pathlib, sys
ckpt = pathlib.Path(os.environ["HAI_MODEL_DIR"]) / "ckpt.pt"
step = int(ckpt.read_text()) if ckpt.exists() else 0
print(f"resumed from step {step}", flush=True)
for step in range(step + 1, step + 4):
    part = ckpt.with_name("ckpt.part")
    part.write_text(str(step))
    os.replace(part, ckpt)
print(f"reached step {step}", flush=True)
sys.exit(3 if pathlib.Path("fail").exists() else 0)
"""
"""The platform document's pattern: one checkpoint path of its own under the model dir, loaded at
start when it is there (never HAI_LATEST_CHECKPOINT); three steps a run; fails while `fail` is there."""


def _failed_once(server: LiveServer, code: Path) -> int:
    out = hai(server, "alice", "submit", "cpu", "--name=keeps", f"--code-dir={code}", "--wait",
              f"{sys.executable} train.py")  # fmt: skip
    assert "FAILED" in out.stdout, out.stdout + out.stderr
    task = int(out.stdout.split("created task ")[1].split()[0])
    detail = json.loads(_run(server, "task", str(task), "-o", "json"))
    assert detail["latest_checkpoint"].endswith(f"/jobs/{task}/model/ckpt.pt"), detail["latest_checkpoint"]
    return task


def _requeued(server: LiveServer, *args: str) -> int:
    out = _run(server, "requeue", *args)
    new = int(out.split(" as task ")[1].split()[0])
    assert "SUCCEEDED" in _run(server, "wait", str(new)), f"task {new} did not succeed"
    return new


@pytest.fixture
def code(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(TRAIN, encoding="utf-8")
    (tmp_path / "fail").write_text("")
    return tmp_path


def test_a_requeued_task_goes_on_from_the_checkpoint_in_its_own_model_dir(
    server: LiveServer, code: Path, tmp_path: Path
) -> None:
    old = _failed_once(server, code)
    (code / "fail").unlink()
    new = _requeued(server, str(old))

    log = _run(server, "log", str(new), "--tail", "0")
    assert "resumed from step 3" in log and "reached step 6" in log, log
    detail = json.loads(_run(server, "task", str(new), "-o", "json"))
    carried = f"{server.home}/jobs/{new}/model/ckpt.pt"
    assert detail["latest_checkpoint"] == carried
    assert any(e["kind"] == "note" and "carried over" in e["reason"] for e in detail["events"]), detail[
        "events"
    ]
    (first,) = json.loads(_run(server, "instance", "--task-id", str(new), "--json"))
    assert first["resume"] is True and first["checkpoint"] == carried

    # The old task keeps its files as it ended: `hai cp` reads step 3 there, step 6 in the new one.
    _run(server, "cp", f"{old}:ckpt.pt", str(tmp_path / "old.pt"))
    _run(server, "cp", f"{new}:ckpt.pt", str(tmp_path / "new.pt"))
    assert (tmp_path / "old.pt").read_text() == "3" and (tmp_path / "new.pt").read_text() == "6"


def test_a_fresh_requeue_starts_at_step_zero_in_an_empty_model_dir(server: LiveServer, code: Path) -> None:
    old = _failed_once(server, code)
    (code / "fail").unlink()
    new = _requeued(server, str(old), "--fresh")
    log = _run(server, "log", str(new), "--tail", "0")
    assert "resumed from step 0" in log and "reached step 3" in log, log


def test_another_user_cannot_requeue_the_task(server: LiveServer, code: Path) -> None:
    old = _failed_once(server, code)
    refused = hai(server, "dave", "requeue", str(old))
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
    mine = json.loads(_run(server, "task", "--json"))
    assert not [j for j in mine if j["requeued_from"] == old], "no task was made"
