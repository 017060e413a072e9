"""Traps a first week of use found (issue 40), each through the real CLI against a live server:
`hai log` takes a task id and says why there is no log, GPU counts never round up unseen, and the
CLI's own messages say task and end a sentence once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import Hai, json_out
from tests.cli.test_live import as_user, created_id, python, wait_for
from tests.support.live_server import LiveServer

TICKS = "import time\nfor i in range(600):\n    print('tick', i, flush=True)\n    time.sleep(0.2)\n"


@pytest.fixture
def code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "long.py").write_text(TICKS, encoding="utf-8")
    (code / "hello.py").write_text("print('hello from the task', flush=True)\n", encoding="utf-8")
    (code / "silent_fail.py").write_text("raise SystemExit(3)\n", encoding="utf-8")
    return code


def create(hai: Hai, env: dict[str, str], code: Path, script: str, package: int) -> int:
    result = hai(
        "create", f"--task-name={script}", f"--code-path={code}", f"--resource-pkg={package}",
        f"--cmd={python(script)}", env=env,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return created_id(result.stdout)


def pending_then_cancelled(hai: Hai, server: LiveServer, code: Path) -> tuple[int, int]:
    """alice's task fills the node and bob's waits for it: (alice's id, bob's PENDING one)."""
    alice, bob = as_user(server, "alice"), as_user(server, "bob")
    hog = create(hai, alice, code, "long.py", 457)
    wait_for(server, hog, {"RUNNING"})
    return hog, create(hai, bob, code, "hello.py", 454)


def cancel(hai: Hai, server: LiveServer, *jobs: tuple[int, str]) -> None:
    """Cancel each (id, owner) as its owner and wait until it is CANCELLED."""
    for job_id, user in jobs:
        assert hai("cancel", str(job_id), "--yes", env=as_user(server, user)).exit_code == 0
        wait_for(server, job_id, {"CANCELLED"})


def test_log_takes_a_task_id_like_every_other_command(hai: Hai, live_server: LiveServer, code: Path) -> None:
    bob = as_user(live_server, "bob")
    hog, waiting = pending_then_cancelled(hai, live_server, code)
    cancel(hai, live_server, (waiting, "bob"), (hog, "alice"))

    # The cancelled task took a task id and no instance, so task and instance ids now differ.
    hello = create(hai, bob, code, "hello.py", 454)
    wait_for(live_server, hello, {"SUCCEEDED"})
    [run] = json_out(hai("instance", str(hello), "--json", env=bob))
    assert run["id"] != hello
    by_task = hai("log", str(hello), env=bob)
    assert by_task.exit_code == 0 and by_task.stdout == "hello from the task\n", by_task.output
    assert hai("log", "--instance-id", str(run["id"]), env=bob).stdout == by_task.stdout
    both = hai("log", str(hello), "--instance-id", str(run["id"]), env=bob)
    assert both.exit_code == 2 and "give either a task id" in both.stderr


def test_log_of_a_task_without_output_says_why_and_exits_1(
    hai: Hai, live_server: LiveServer, code: Path
) -> None:
    bob = as_user(live_server, "bob")
    hog, waiting = pending_then_cancelled(hai, live_server, code)
    pending = hai("log", str(waiting), env=bob)
    assert pending.exit_code == 1 and pending.stdout == "", pending.output
    assert f"task {waiting} is PENDING" in pending.stderr and "has not started yet" in pending.stderr

    cancel(hai, live_server, (waiting, "bob"), (hog, "alice"))
    cancelled = hai("log", "--task-id", str(waiting), env=bob)
    assert cancelled.exit_code == 1 and cancelled.stdout == "", cancelled.output
    assert f"task {waiting} is CANCELLED" in cancelled.stderr and "never started" in cancelled.stderr

    silent = create(hai, bob, code, "silent_fail.py", 454)
    wait_for(live_server, silent, {"FAILED"})
    empty = hai("log", str(silent), env=bob)
    assert empty.exit_code == 1 and empty.stdout == "", empty.output
    assert "printed nothing" in empty.stderr and f"task {silent} is FAILED" in empty.stderr


def test_submit_names_the_package_it_rounded_up_to_and_exact_refuses(
    hai: Hai, live_server: LiveServer, code: Path
) -> None:
    alice = as_user(live_server, "alice")
    short = ("--name=up", f"--code-dir={code}", "--gpu-type=v100")

    rounded = hai("submit", "standalone", *short, "--gpus=3", "-o", "json", "echo hi", env=alice)
    assert rounded.exit_code == 0, rounded.output
    assert json.loads(rounded.stdout)["spec"]["resource_pkg"] == 456, "stdout stays the JSON alone"
    assert rounded.stderr.strip() == (
        "package 456: 4×V100 (asked for 3 GPUs; the smallest package that fits)"
    )

    exact = hai("submit", "standalone", *short, "--gpus=3", "--exact", "echo hi", env=alice)
    assert exact.exit_code == 2 and exact.stdout == "", exact.output
    assert exact.stderr.startswith("Error: --gpus 3 --exact:")
    assert "Give --gpus 1, 2, 4 or 8" in exact.stderr and "leave out --exact" in exact.stderr

    fits = hai("submit", "standalone", *short, "--gpus=4", "--exact", "echo hi", env=alice)
    assert fits.exit_code == 0 and fits.stderr == "", fits.output

    workers = hai(
        "submit", "distributed", *short, "--workers=2", "--gpus=3", "echo hi", env=alice
    )  # fmt: skip
    assert workers.exit_code == 0, workers.output
    assert "(asked for 3 GPUs per worker;" in workers.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(
            ("create", "--task-name=t", "--code-path=/tmp", "--cmd=x"),
            "Error: --resource-pkg is required for a standalone task. See `hai create --help`.",
            id="a missing flag",
        ),
        pytest.param(
            ("submit", "standalone", "--name=t", "--code-dir=/tmp", "--gpus=0", "x"),
            "Error: --gpus must be 1 or more. For a task without GPUs use `hai submit cpu`.",
            id="no GPUs",
        ),
    ],
)
def test_the_clis_own_errors_say_task_as_its_successes_do(
    hai: Hai, live_server: LiveServer, args: tuple[str, ...], expected: str
) -> None:
    result = hai(*args, env=as_user(live_server, "alice"))
    assert result.exit_code == 2 and result.stderr.strip() == expected, result.output
