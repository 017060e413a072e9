"""`hai exec` and `hai cp` through the real CLI against a live server (local backend): a command runs
beside a running task's worker with its environment and exit code, is killed at its timeout; files of
the model dir come down whole, links in it are never followed; and who may do either."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import Hai, json_out
from tests.cli.test_live import as_user, created_id, python, wait_for
from tests.support.live_server import LiveServer

WRITES = """\
import os, pathlib, time
model = pathlib.Path(os.environ["HAI_MODEL_DIR"])
(model / "checkpoints" / "deep").mkdir(parents=True, exist_ok=True)
(model / "checkpoints" / "step-1.pt").write_bytes(bytes(range(256)) * 4096)
(model / "checkpoints" / "deep" / "note.txt").write_text("deep")
(model / "final.txt").write_text("trained")
os.symlink("/etc/passwd", model / "passwd")
os.symlink("/etc", model / "checkpoints" / "etc")
pathlib.Path("ready").write_text("yes")
time.sleep(600)
"""
"""Fills its model dir (a 1 MiB checkpoint, a nested file, links out of it), then runs until cancelled."""


@pytest.fixture(scope="module")
def running(server: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """One task of alice's, running, its model dir filled: (task id, code dir)."""
    from typer.testing import CliRunner

    from hai_airflow.cli.main import app

    code = tmp_path_factory.mktemp("code")
    (code / "writes.py").write_text(WRITES, encoding="utf-8")
    made = CliRunner().invoke(
        app,
        [
            "create",
            "--task-name=filled",
            f"--code-path={code}",
            "--resource-pkg=455",
            f"--cmd={python('writes.py')}",
        ],
        env=as_user(server, "alice"),
    )
    assert made.exit_code == 0, made.output
    job_id = created_id(made.stdout)
    wait_for(server, job_id, {"RUNNING"})
    for _ in range(200):
        if (code / "ready").exists():
            break
        import time

        time.sleep(0.05)
    yield job_id, code
    server.cancel_all()


def test_exec_runs_beside_the_worker_with_its_environment_and_exit_code(
    hai: Hai, server: LiveServer, running: tuple[int, Path]
) -> None:
    job_id, code = running
    alice = as_user(server, "alice")
    done = hai(
        "exec", str(job_id), "--", "sh", "-c",
        'echo "job=$HAI_JOB_ID gpus=$CUDA_VISIBLE_DEVICES"; pwd; echo oops >&2; exit 3', env=alice,
    )  # fmt: skip
    assert done.exit_code == 3, done.output
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"job={job_id} gpus=") and len(lines[0].split("gpus=")[1].split(",")) == 2
    assert lines[1] == str(code) and lines[2] == "oops"
    # The task's events say who ran what.
    task = json_out(hai("task", str(job_id), "-o", "json", env=alice))
    assert any(e["kind"] == "exec" and "alice ran `sh -c" in e["reason"] for e in task["events"])


def test_exec_is_killed_at_its_timeout(hai: Hai, server: LiveServer, running: tuple[int, Path]) -> None:
    job_id, _ = running
    done = hai("exec", str(job_id), "--timeout=1s", "--", "sleep", "60", env=as_user(server, "alice"))
    assert done.exit_code == 137, done.output
    assert "hai: killed after its timeout of 1 s" in done.stderr


@pytest.mark.parametrize(
    ("user", "code", "says"),
    [
        ("bob", 1, "task {id} not found"),  # the same group, not its admin: does not see it
        ("dave", 1, "task {id} not found"),
        ("carol", 1, "only alice may run commands in task {id}"),  # sees it, may not act as alice
        ("admin", 1, "only alice may run commands in task {id}"),
    ],
)
def test_exec_in_another_users_task_is_refused(
    hai: Hai, server: LiveServer, running: tuple[int, Path], user: str, code: int, says: str
) -> None:
    job_id, _ = running
    refused = hai("exec", str(job_id), "--", "touch", "/tmp/hai-exec-refused", env=as_user(server, user))
    assert refused.exit_code == code, refused.output
    assert says.format(id=job_id) in refused.stderr and "Traceback" not in refused.output
    assert not Path("/tmp/hai-exec-refused").exists()


def test_exec_in_a_worker_it_does_not_have_or_a_task_not_running_is_refused(
    hai: Hai, server: LiveServer, running: tuple[int, Path]
) -> None:
    job_id, code = running
    alice = as_user(server, "alice")
    refused = hai("exec", str(job_id), "-w", "3", "--", "true", env=alice)
    assert refused.exit_code == 2 and "has 1 worker(s); there is no worker 3" in refused.stderr
    ended = created_id(
        hai(
            "create", "--task-name=done", f"--code-path={code}", "--resource-pkg=100", "--cmd=true", env=alice
        ).stdout
    )
    wait_for(server, ended, {"SUCCEEDED"})
    refused = hai("exec", str(ended), "--", "true", env=alice)
    assert refused.exit_code == 1 and f"task {ended} is not running (SUCCEEDED)" in refused.stderr


def test_cp_downloads_a_file_and_a_whole_directory_without_following_links(
    hai: Hai, server: LiveServer, running: tuple[int, Path], tmp_path: Path
) -> None:
    job_id, _ = running
    alice = as_user(server, "alice")
    copied = hai("cp", f"{job_id}:checkpoints/step-1.pt", str(tmp_path), env=alice)
    assert copied.exit_code == 0, copied.output
    assert (tmp_path / "step-1.pt").read_bytes() == bytes(range(256)) * 4096
    assert copied.stdout.strip() == f"copied 1 file (1048576 bytes) to {tmp_path}"
    whole = tmp_path / "run"
    copied = hai("cp", f"{job_id}:", str(whole), env=alice)
    assert copied.exit_code == 0, copied.output
    assert (whole / "final.txt").read_text() == "trained"
    assert (whole / "checkpoints" / "deep" / "note.txt").read_text() == "deep"
    assert not (whole / "passwd").exists() and not (whole / "checkpoints" / "etc").exists()
    assert "skipped passwd: a link, not copied" in copied.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".part")) == []
    out = hai("cp", f"{job_id}:final.txt", "-", env=alice)
    assert out.exit_code == 0 and out.stdout == "trained"


def test_cp_lists_a_directory(hai: Hai, server: LiveServer, running: tuple[int, Path]) -> None:
    job_id, _ = running
    listed = json_out(
        hai("cp", f"{job_id}:checkpoints", "--list", "-o", "json", env=as_user(server, "alice"))
    )
    assert {(e["name"], e["kind"]) for e in listed} == {
        ("deep", "dir"),
        ("etc", "link"),
        ("step-1.pt", "file"),
    }


@pytest.mark.parametrize(
    ("path", "code", "says"),
    [
        ("passwd", 1, "passwd is a symbolic link or leads through one"),
        ("checkpoints/etc/passwd", 1, "is a symbolic link or leads through one"),
        ("../../../etc/passwd", 2, "climbs out of the model dir with '..'"),
        ("/etc/passwd", 2, "/etc/passwd is not in the task's model dir"),
        ("missing.pt", 1, "there is no missing.pt in the model dir of task"),
    ],
)
def test_cp_of_a_path_outside_the_model_dir_is_refused(
    hai: Hai, server: LiveServer, running: tuple[int, Path], tmp_path: Path, path: str, code: int, says: str
) -> None:
    job_id, _ = running
    refused = hai("cp", f"{job_id}:{path}", str(tmp_path / "out"), env=as_user(server, "alice"))
    assert refused.exit_code == code, refused.output
    assert says in refused.stderr and "Traceback" not in refused.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("user", "allowed"), [("carol", True), ("admin", True), ("bob", False), ("dave", False)]
)
def test_cp_from_another_users_task_is_for_the_admins_of_its_group(
    hai: Hai, server: LiveServer, running: tuple[int, Path], tmp_path: Path, user: str, allowed: bool
) -> None:
    job_id, _ = running
    done = hai("cp", f"{job_id}:final.txt", str(tmp_path), env=as_user(server, user))
    if allowed:
        assert done.exit_code == 0 and (tmp_path / "final.txt").read_text() == "trained"
    else:
        assert done.exit_code == 1 and f"task {job_id} not found" in done.stderr
        assert not (tmp_path / "final.txt").exists()


def test_cp_of_a_task_that_never_started_says_so(
    hai: Hai, server: LiveServer, running: tuple[int, Path], tmp_path: Path
) -> None:
    alice = as_user(server, "alice")
    held = created_id(
        hai("create", "--task-name=after", f"--code-path={tmp_path}", "--resource-pkg=100", "--cmd=true",
            f"--after={running[0]}", env=alice).stdout
    )  # fmt: skip
    refused = hai("cp", f"{held}:", str(tmp_path / "out"), env=alice)
    assert (
        refused.exit_code == 1 and f"task {held} has not started: it has no model dir yet" in refused.stderr
    )
    bad = hai("cp", "x:final.txt", ".", env=alice)
    assert bad.exit_code == 2 and "names no task" in bad.stderr
