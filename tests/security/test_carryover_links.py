"""`hai requeue` carries a task's model dir over without following a link the job planted: files the
job links to (another user's, the server's) stay behind, and a model dir the job swapped for a link
to another dir is not carried at all. The server walks the old dir from the job's own dir with
O_NOFOLLOW at every step (`control.carryover`), so a link is never the way into someone else's files."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.security.cli import hai
from tests.support.live_cli import hai_ok as _run
from tests.support.live_cli import module_server  # noqa: F401 (the fixture `server`)
from tests.support.live_server import LiveServer

PLANTS = """\
import os, pathlib, sys
model = pathlib.Path(os.environ["HAI_MODEL_DIR"])
(model / "ckpt.pt").write_text("3")
os.symlink(sys.argv[1], model / "stolen.pt")          # a file of someone else's
os.symlink(os.path.dirname(sys.argv[1]), model / "stolen-dir")
os.mkfifo(model / "pipe")
sys.exit(3)
"""
"""Saves its checkpoint, plants links to another user's file and dir and a fifo, and fails."""

SWAPS = """\
import json, os, pathlib, sys, time, urllib.request
model = pathlib.Path(os.environ["HAI_MODEL_DIR"])
(model / "ckpt.pt").write_text("3")
token = pathlib.Path(os.environ["HAI_TOKEN_FILE"]).read_text().strip()
ask = urllib.request.Request(os.environ["HAI_SERVER"] + "/api/v1/jobs/" + os.environ["HAI_JOB_ID"],
                             headers={"Authorization": "Bearer " + token})
for _ in range(600):  # until the server has seen the checkpoint (its scanner), so a carry is planned
    if (json.load(urllib.request.urlopen(ask)).get("latest_checkpoint") or "").endswith("ckpt.pt"):
        break
    time.sleep(0.05)
else:
    sys.exit("the server never saw the checkpoint")
os.rename(model, model.with_name("model.moved"))
os.symlink(sys.argv[1], model)                        # the whole model dir is now someone else's
sys.exit(3)
"""
"""Saves its checkpoint and, once the server has seen it (asked with the job's own credential), swaps
its model dir for a link to another user's dir, and fails."""

NEXT = """\
import os, pathlib
model = pathlib.Path(os.environ["HAI_MODEL_DIR"])
print("sees", sorted(p.name for p in model.iterdir()), flush=True)
"""


@pytest.fixture
def others(tmp_path: Path) -> Path:
    """Another user's dir with a secret file in it, outside every job's dir."""
    home = tmp_path / "bob-home"
    home.mkdir(mode=0o700)
    (home / "secret.pt").write_text("BOB-PRIVATE-WEIGHTS")
    return home


def _failed(server: LiveServer, code: Path, script: str, target: Path) -> int:
    (code / "job.py").write_text(script, encoding="utf-8")
    (code / "next.py").write_text(NEXT, encoding="utf-8")
    out = hai(server, "alice", "submit", "cpu", "--name=plants", f"--code-dir={code}", "--wait",
              f"{sys.executable} job.py {target}")  # fmt: skip
    assert "FAILED" in out.stdout, out.stdout + out.stderr
    return int(out.stdout.split("created task ")[1].split()[0])


def _requeued(server: LiveServer, old: int) -> tuple[int, dict[str, object]]:
    """Requeue `old` with the next script in place of its command (a requeue runs the same command:
    the job file is changed in the code dir, which is read again)."""
    out = _run(server, "requeue", str(old))
    new = int(out.split(" as task ")[1].split()[0])
    _run(server, "wait", str(new))
    return new, json.loads(_run(server, "task", str(new), "-o", "json"))


def test_links_and_fifos_the_job_planted_stay_behind(
    server: LiveServer, tmp_path: Path, others: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    old = _failed(server, code, PLANTS, others / "secret.pt")
    (code / "job.py").write_text(NEXT, encoding="utf-8")
    new, detail = _requeued(server, old)

    model = Path(f"{server.home}/jobs/{new}/model")
    assert sorted(os.listdir(model)) == ["ckpt.pt"], os.listdir(model)
    assert (model / "ckpt.pt").read_text() == "3"
    log = _run(server, "log", str(new), "--tail", "0")
    assert "sees ['ckpt.pt']" in log, log
    assert "BOB-PRIVATE-WEIGHTS" not in log
    notes = [e["reason"] for e in detail["events"] if e["kind"] == "note"]  # type: ignore[index]
    assert any("1 files of task" in n and "carried over" in n for n in notes), notes
    assert (others / "secret.pt").read_text() == "BOB-PRIVATE-WEIGHTS"  # untouched, not linked twice
    assert os.stat(others / "secret.pt").st_nlink == 1


def test_a_model_dir_swapped_for_a_link_is_not_carried(
    server: LiveServer, tmp_path: Path, others: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    old = _failed(server, code, SWAPS, others)
    (code / "job.py").write_text(NEXT, encoding="utf-8")
    new, detail = _requeued(server, old)

    model = Path(f"{server.home}/jobs/{new}/model")
    assert not (model / "secret.pt").exists(), os.listdir(model) if model.exists() else "no model dir"
    assert not model.is_symlink()
    log = _run(server, "log", str(new), "--tail", "0")
    assert "secret.pt" not in log and "BOB-PRIVATE-WEIGHTS" not in log, log
    notes = [e["reason"] for e in detail["events"] if e["kind"] == "note"]  # type: ignore[index]
    assert not any("carried over into" in n for n in notes), notes
    assert os.stat(others / "secret.pt").st_nlink == 1
