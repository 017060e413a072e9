"""`hai admin check` on a live store: a history made of preemptions, resumes, cancels, failures and
successes has no problem; the same store with a state, a run and a GPU hold corrupted by hand has
exactly those; and only platform admins may run it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.cli.conftest import Hai, json_out
from tests.cli.test_live import as_user, created_id, python, wait_for
from tests.support.live_server import LiveServer


@pytest.fixture
def code(tmp_path: Path) -> Path:
    (tmp_path / "long.py").write_text("import time; time.sleep(600)\n", encoding="utf-8")
    return tmp_path


def create(hai: Hai, env: dict[str, str], code: Path, cmd: str, *flags: str) -> int:
    made = hai("create", "--task-name=t", f"--code-path={code}", f"--cmd={cmd}", *flags, env=env)
    assert made.exit_code == 0, made.output
    return created_id(made.stdout)


def test_a_live_history_checks_clean_and_hand_made_corruption_is_found(
    hai: Hai, clean: LiveServer, code: Path
) -> None:
    alice, bob, admin = (as_user(clean, u) for u in ("alice", "bob", "admin"))
    low = create(hai, bob, code, python("long.py"), "--resource-pkg=456", "--elastic")
    wait_for(clean, low, {"RUNNING"})
    high = create(hai, alice, code, "true", "--resource-pkg=457", "--max-schedule=4")
    wait_for(clean, high, {"SUCCEEDED"})
    wait_for(clean, low, {"RUNNING"})  # resumed once the high task ended
    failed = create(hai, alice, code, "exit 3", "--resource-pkg=454")
    wait_for(clean, failed, {"FAILED"})
    assert hai("cancel", str(low), "--yes", env=bob).exit_code == 0
    wait_for(clean, low, {"CANCELLED"})

    checked = hai("admin", "check", env=admin)
    assert checked.exit_code == 0, checked.output
    said = checked.stdout.rstrip()
    assert said.startswith(f"checked {failed} tasks, 4 instances, ") and said.endswith("no problems")
    refused = hai("admin", "check", env=alice)
    assert refused.exit_code == 1 and "only a platform admin can check the store" in refused.stderr

    runs = json_out(hai("instance", str(low), "-o", "json", env=bob))
    assert len(runs) == 2  # ran, was suspended for the high task, resumed
    with sqlite3.connect(clean.home / "hai.db") as db:
        db.execute("UPDATE jobs SET state = 'RUNNING' WHERE id = ?", (high,))
        # a second run of the failed task beside its first, on the same GPU
        db.execute(
            "INSERT INTO instances (job_id, created_at, started_at, ended_at, placement, log_path, work_dir, "
            "model_dir, resume, grace_seconds, lost_gpu_seconds) "
            "SELECT job_id, created_at, started_at, ended_at, placement, log_path, work_dir, model_dir, "
            "0, 0, 0 FROM instances WHERE job_id = ?",
            (failed,),
        )
    found = hai("admin", "check", "-o", "json", env=admin)
    assert found.exit_code == 1 and found.stdout, found.output
    problems = {(p["job_id"], p["what"].split(" at ")[0]) for p in json_out(found)["problems"]}
    assert (high, "the job is RUNNING, but its events lead to SUCCEEDED") in problems
    overlapping = [p for p in json_out(found)["problems"] if p["job_id"] == failed]
    assert any(p["what"].endswith("overlap") for p in overlapping), overlapping
    assert any("while instance" in p["what"] for p in json_out(found)["problems"]), found.stdout
