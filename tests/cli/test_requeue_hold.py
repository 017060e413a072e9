"""`hai requeue`, `hai hold` and `hai release` against a real `hai serve`: an ended task runs again as a
new task (from its checkpoint, or afresh), a held task waits until released, and who may do either."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import Hai, json_out
from tests.cli.test_live import as_user, created_id, python, wait_for
from tests.support.live_server import LiveServer

TRAIN = """\
import os, pathlib, sys
model = pathlib.Path(os.environ["HAI_MODEL_DIR"])
latest = os.environ.get("HAI_LATEST_CHECKPOINT")
step = int(pathlib.Path(latest).read_text()) if latest else 0
print("resume", os.environ["HAI_RESUME"], "from step", step, flush=True)
for step in range(step + 1, step + 4):
    (model / "next.tmp").write_text(str(step))
    os.replace(model / "next.tmp", model / f"checkpoint-{step:04d}.pt")
print("reached step", step, flush=True)
sys.exit(3 if pathlib.Path("fail").exists() else 0)
"""
"""Saves checkpoints of three more steps, from the one it resumes at; fails while `fail` lies beside it."""

LONG = "import time; time.sleep(600)"


@pytest.fixture
def code(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(TRAIN, encoding="utf-8")
    (tmp_path / "long.py").write_text(LONG, encoding="utf-8")
    return tmp_path


def create(hai: Hai, env: dict[str, str], code: Path, script: str, pkg: int = 454) -> int:
    made = hai(
        "create", "--task-name=t", f"--code-path={code}", f"--resource-pkg={pkg}", f"--cmd={python(script)}",
        env=env,
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    return created_id(made.stdout)


def log_of(hai: Hai, env: dict[str, str], task: int) -> str:
    out = hai("log", "--task-id", str(task), "--tail", "0", env=env)
    assert out.exit_code == 0, out.output
    return out.stdout


def test_a_failed_task_runs_again_from_its_checkpoint_or_afresh(
    hai: Hai, clean: LiveServer, code: Path
) -> None:
    alice = as_user(clean, "alice")
    (code / "fail").write_text("")
    resumed, fresh = create(hai, alice, code, "train.py"), create(hai, alice, code, "train.py")
    saved = wait_for(clean, resumed, {"FAILED"}).latest_checkpoint
    assert saved is not None and saved.endswith(f"/{resumed}/model/checkpoint-0003.pt")
    assert wait_for(clean, fresh, {"FAILED"}).latest_checkpoint is not None
    (code / "fail").unlink()

    again = hai("requeue", str(resumed), env=alice)
    assert again.exit_code == 0, again.output
    assert again.stdout.startswith(f"requeued task {resumed} as task ")
    new = int(again.stdout.split()[5])
    assert again.stdout.strip().endswith(f"(from its checkpoint {saved})")
    afresh = hai("requeue", str(fresh), "--fresh", env=alice)
    assert afresh.exit_code == 0, afresh.output
    new_fresh = int(afresh.stdout.split()[5])
    assert afresh.stdout.strip() == f"requeued task {fresh} as task {new_fresh} (from the start)"

    # The new tasks run to success: one goes on from step 3, the other starts over.
    for task in (new, new_fresh):
        wait_for(clean, task, {"SUCCEEDED"})
    went_on = log_of(hai, alice, new)
    assert "resume 1 from step 3" in went_on and "reached step 6" in went_on
    assert "resume 0 from step 0" in log_of(hai, alice, new_fresh)
    (first,) = json_out(hai("instance", "--task-id", str(new), "--json", env=alice))
    # It resumed from that checkpoint as carried over into its own model dir (`carryover`).
    assert first["resume"] is True and first["checkpoint"] == saved.replace(f"/{resumed}/", f"/{new}/")

    # Linked both ways: the new task names the old, the old one's last event the new; the old stays FAILED.
    detail = json_out(hai("task", str(new), "--json", env=alice))
    assert detail["requeued_from"] == resumed and detail["spec"]["cmd"] == python("train.py")
    assert detail["events"][0]["kind"] == "requeued"
    assert f"requeued from task {resumed} by alice" in detail["events"][0]["reason"]
    human = hai("task", str(new), env=alice).stdout
    assert any(line.split() == ["requeued", "from", "task", str(resumed)] for line in human.splitlines())
    old = json_out(hai("task", str(resumed), "--json", env=alice))
    assert old["state"] == "FAILED" and old["events"][-1]["kind"] == "requeued"
    assert old["events"][-1]["reason"].startswith(f"requeued as task {new} by alice")

    # Asked again (a double click, a retried request), the same new task answers; no third task is made.
    twice = hai("requeue", str(resumed), env=alice)
    assert twice.exit_code == 0 and twice.stdout.startswith(f"requeued task {resumed} as task {new} ")
    mine = json_out(hai("task", "--json", env=alice))
    assert [j["id"] for j in mine if j["requeued_from"] == resumed] == [new]


def test_only_an_ended_task_that_did_not_succeed_is_requeued(hai: Hai, clean: LiveServer, code: Path) -> None:
    alice, bob = as_user(clean, "alice"), as_user(clean, "bob")
    running = create(hai, alice, code, "long.py", pkg=457)
    wait_for(clean, running, {"RUNNING"})
    pending = create(hai, alice, code, "long.py")
    refused = hai("requeue", str(running), env=alice)
    assert refused.exit_code == 1
    assert refused.stderr.startswith(f"Error: cannot requeue task {running}: it is RUNNING, not ended")
    assert f"hai cancel {running}" in refused.stderr
    assert "it is PENDING" in hai("requeue", str(pending), env=alice).stderr

    done = create(hai, alice, code, "train.py")
    assert hai("cancel", str(running), env=alice).exit_code == 0
    wait_for(clean, done, {"SUCCEEDED"})
    succeeded = hai("requeue", str(done), env=alice)
    assert succeeded.exit_code == 1 and "it SUCCEEDED" in succeeded.stderr
    # The refusals of a task that ended otherwise point at `hai requeue`.
    wait_for(clean, running, {"CANCELLED"})
    ended = hai("cancel", str(running), env=alice)
    assert ended.exit_code == 1 and f"`hai requeue {running}` runs it again" in ended.stderr
    # Another user: the task does not exist for them, as everywhere else.
    others = hai("requeue", str(running), env=bob)
    assert others.exit_code == 1 and "not found" in others.stderr


def test_a_held_task_waits_until_released(hai: Hai, clean: LiveServer, code: Path) -> None:
    alice, bob, carol = (as_user(clean, u) for u in ("alice", "bob", "carol"))
    blocker = create(hai, alice, code, "long.py", pkg=457)  # all 8 GPUs
    wait_for(clean, blocker, {"RUNNING"})
    task = create(hai, alice, code, "train.py")

    refused = hai("hold", str(blocker), env=alice)
    assert refused.exit_code == 1 and f"hai suspend {blocker}" in refused.stderr
    assert hai("hold", str(task), env=bob).exit_code == 1, "another user may not hold it"
    held = hai("hold", str(task), env=alice)
    assert held.exit_code == 0, held.output
    assert held.stdout.strip() == f"held task {task} (now PENDING)"
    reason = f"held by alice; `hai release {task}` releases it"
    assert json_out(hai("task", str(task), "--json", env=alice))["reason"] == reason
    queued = json_out(hai("queue", "--json", env=alice))
    assert [e["reason"] for e in queued if e["job"]["id"] == task] == [reason]

    # GPUs free up, and the held task still waits.
    hai("cancel", str(blocker), env=alice)
    wait_for(clean, blocker, {"CANCELLED"})
    with clean.client() as client:
        assert client.wait(task, since_state="PENDING", timeout=2).state == "PENDING"

    # An admin's hold wins over the owner's: she cannot release it, her group admin can.
    assert hai("suspend", str(task), env=carol).exit_code == 0
    over = json_out(hai("task", str(task), "--json", env=alice))["reason"]
    assert over == f"suspended by admin carol; `hai resume {task}` releases it"
    mine = hai("release", str(task), env=alice)
    assert mine.exit_code == 1 and "only an admin of group vision can release it" in mine.stderr
    assert hai("release", str(task), env=bob).exit_code == 1
    released = hai("release", str(task), env=carol)
    assert released.exit_code == 0 and released.stdout.startswith(f"released task {task} (now ")
    wait_for(clean, task, {"SUCCEEDED"})
    again = hai("release", str(task), env=alice)
    assert again.exit_code == 1 and "already ended" in again.stderr
