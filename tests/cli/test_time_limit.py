"""`--time-limit` through the real CLI against a live server: every submit path takes it, a task past
it ends TIMEOUT and `hai wait` says so with exit 1, and a limit without a unit is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import Hai, json_out
from tests.cli.test_live import as_user, created_id, python, wait_for
from tests.support.live_server import LiveServer


@pytest.fixture
def code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "sleeps.py").write_text("import time\ntime.sleep(60)\n", encoding="utf-8")
    return code


def test_a_task_past_its_time_limit_ends_timeout_and_wait_exits_1(
    hai: Hai, live_server: LiveServer, code: Path
) -> None:
    alice = as_user(live_server, "alice")
    made = hai(
        "create", "--task-name=limited", f"--code-path={code}", "--resource-pkg=454",
        f"--cmd={python('sleeps.py')}", "--time-limit=2s", env=alice,
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    job_id = created_id(made.stdout)
    waited = hai("wait", str(job_id), "--timeout=60", env=alice)
    assert waited.exit_code == 1, waited.output
    assert f"task {job_id} TIMEOUT (reached its time limit of 2s;" in waited.stdout
    task = json_out(hai("task", str(job_id), "-o", "json", env=alice))
    assert task["state"] == "TIMEOUT" and task["spec"]["time_limit_seconds"] == 2
    shown = hai("task", str(job_id), env=alice).stdout
    assert any(line.split() == ["time", "limit", "2s"] for line in shown.splitlines()), shown
    wide = hai("task", "-o", "wide", env=alice).stdout.splitlines()
    assert "ENDED" in wide[0].split() and len([w for w in wide if w.split()[0] == str(job_id)]) == 1


@pytest.mark.parametrize(
    "submit",
    [
        ["submit", "cpu", "--name=cpu"],
        ["submit", "standalone", "--name=one", "--gpus=1"],
        ["submit", "distributed", "--name=two", "--workers=2", "--gpus=1"],
    ],
)
def test_every_submit_command_takes_a_time_limit(
    hai: Hai, live_server: LiveServer, code: Path, submit: list[str]
) -> None:
    alice = as_user(live_server, "alice")
    made = hai(*submit, f"--code-dir={code}", "--time-limit=1h30m", "-o", "json", "--", "true", env=alice)
    assert made.exit_code == 0, made.output
    task = json_out(made)
    assert task["spec"]["time_limit_seconds"] == 5400
    wait_for(live_server, task["id"], {"SUCCEEDED"})


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("90", "'90' has no unit: write 90m for minutes or 90s for seconds"),
        ("soon", "'soon' is not a duration: write a number with units"),
        ("0s", "--time-limit: input should be greater than 0"),
    ],
)
def test_a_time_limit_that_is_not_a_duration_is_refused_with_exit_2(
    hai: Hai, live_server: LiveServer, code: Path, value: str, says: str
) -> None:
    alice = as_user(live_server, "alice")
    before = json_out(hai("task", "--all", "-o", "json", env=alice))
    refused = hai(
        "submit", "cpu", "--name=bad", f"--code-dir={code}", f"--time-limit={value}", "--", "true", env=alice
    )
    assert refused.exit_code == 2, refused.output
    assert says in refused.stderr and "Traceback" not in refused.output
    assert json_out(hai("task", "--all", "-o", "json", env=alice)) == before, "nothing was created"
