"""`hai usage` through the real CLI against a live server: GPU-hours, preemption losses and waits per
user and per group, each caller seeing only what they may (their own; a group admin their group's;
a platform admin everyone's), `-o json|csv`, and refusals with the exit codes of every command."""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from hai_airflow.cli.main import app
from tests.cli.conftest import Hai, json_out
from tests.cli.test_live import as_user, created_id, python, wait_for
from tests.support.live_server import TEST_CONFIG, LiveServer, start_server


def run_hai(*args: str, env: dict[str, str]) -> Result:
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


SLEEP = "import time\ntime.sleep(float(__import__('sys').argv[1]))\n"


@pytest.fixture(scope="module")
def used(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, dict[str, int]]]:
    """alice ran 1 GPU for ~2 s and lost her 8-GPU low job's work to bob's high one; dave ran 2 GPUs."""
    code = tmp_path_factory.mktemp("code")
    (code / "sleep.py").write_text(SLEEP, encoding="utf-8")
    with start_server(tmp_path_factory.mktemp("hai"), TEST_CONFIG) as server:

        def create(user: str, package: int, seconds: float, *extra: str) -> int:
            made = run_hai(
                "create", f"--task-name={user}", f"--code-path={code}", f"--resource-pkg={package}",
                f"--cmd={python('sleep.py')} {seconds}", *extra, env=as_user(server, user),
            )  # fmt: skip
            assert made.exit_code == 0, made.output
            return created_id(made.stdout)

        short = create("alice", 454, 2)
        wait_for(server, short, {"SUCCEEDED"})
        dave = create("dave", 455, 1)
        wait_for(server, dave, {"SUCCEEDED"})
        victim = create("alice", 457, 60)
        wait_for(server, victim, {"RUNNING"})
        time.sleep(2)  # work that no checkpoint keeps
        high = create("bob", 454, 1, "--max-schedule=4")
        wait_for(server, high, {"SUCCEEDED"}, timeout=60)
        run_hai("cancel", str(victim), env=as_user(server, "alice"))
        wait_for(server, victim, {"CANCELLED"}, timeout=60)
        yield server, {"short": short, "victim": victim, "high": high, "dave": dave}


def usage(hai: Hai, server: LiveServer, user: str, *args: str) -> list[dict[str, Any]]:
    result = hai("usage", *args, "-o", "json", env=as_user(server, user))
    assert result.exit_code == 0, result.output
    rows: list[dict[str, Any]] = json_out(result)
    return rows


def test_a_user_sees_their_own_use(hai: Hai, used: tuple[LiveServer, dict[str, int]]) -> None:
    server, _ = used
    (alice,) = usage(hai, server, "alice")
    assert (alice["name"], alice["by"], alice["jobs"], alice["waits"]) == ("alice", "user", 2, 2)
    assert alice["ended"] == {"CANCELLED": 1, "SUCCEEDED": 1}
    # 1 GPU for ~2 s, and 8 GPUs for the ~2 s before the preemption and what followed until the resume
    assert alice["high_gpu_hours"] == 0 and alice["low_gpu_hours"] > (1 * 2 + 8 * 2) / 3600
    assert alice["lost_gpu_hours"] >= 8 * 2 / 3600, "the preempted run lost its work since it started"
    assert alice["wait_p50_seconds"] is not None and alice["wait_p95_seconds"] >= alice["wait_p50_seconds"]


def test_a_group_admin_sees_the_users_and_the_total_of_their_group(
    hai: Hai, used: tuple[LiveServer, dict[str, int]]
) -> None:
    server, _ = used
    rows = usage(hai, server, "carol")
    assert [r["name"] for r in rows] == ["alice", "bob"], "dave's group is not carol's"
    bob = rows[1]
    assert bob["high_gpu_hours"] > 0 and bob["low_gpu_hours"] == 0
    (vision,) = usage(hai, server, "carol", "--by", "group")
    assert vision["name"] == "vision"
    assert vision["gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in rows), abs=1e-3)
    everyone = usage(hai, server, "admin", "--by", "group")
    assert [r["name"] for r in everyone] == ["nlp", "vision"]


@pytest.mark.parametrize(
    ("user", "args", "says"),
    [
        ("dave", ("--user", "alice"), "you may not see alice's use"),
        ("dave", ("--user", "nobody"), "you may not see nobody's use"),
        ("bob", ("--by", "group"), "only a group's admins see its totals"),
        ("carol", ("--group", "nlp"), "you may not see the use of group nlp"),
    ],
)
def test_anothers_use_is_refused_and_nothing_is_shown(
    hai: Hai, used: tuple[LiveServer, dict[str, int]], user: str, args: tuple[str, ...], says: str
) -> None:
    server, _ = used
    refused = hai("usage", *args, env=as_user(server, user))
    assert refused.exit_code == 1 and says in refused.stderr and refused.stdout == "", refused.output


def test_a_window_before_any_job_is_empty_and_bad_edges_are_usage_errors(
    hai: Hai, used: tuple[LiveServer, dict[str, int]]
) -> None:
    server, _ = used
    assert usage(hai, server, "alice", "--since", "2020-01-01", "--until", "2020-02-01") == []
    bad = hai("usage", "--since", "yesterday", env=as_user(server, "alice"))
    assert bad.exit_code == 2 and "'yesterday' is not a date (2026-11-01)" in bad.stderr, bad.output
    backwards = hai("usage", "--since", "1h", "--until", "2d", env=as_user(server, "alice"))
    assert backwards.exit_code == 2 and "since must be before until" in backwards.stderr, backwards.output


def test_csv_has_every_column_and_a_table_the_headline_ones(
    hai: Hai, used: tuple[LiveServer, dict[str, int]]
) -> None:
    server, _ = used
    table = hai("usage", env=as_user(server, "carol"))
    assert table.exit_code == 0 and table.stdout.split()[:4] == ["NAME", "TASKS", "GPU-HOURS", "HIGH"]
    sheet = hai("usage", "-o", "csv", env=as_user(server, "carol"))
    rows = list(csv.DictReader(io.StringIO(sheet.stdout)))
    assert [r["NAME"] for r in rows] == ["alice", "bob"] and rows[0]["ENDED"] == "1 cancelled, 1 ok"
