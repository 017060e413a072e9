"""The fair-share term through the real `hai queue` against a live server: after alice has run, dave's
low job goes ahead of alice's older one, and the queue shows the term."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from hai_airflow.scheduling.fairshare import MEASURE_SECONDS
from hai_airflow.scheduling.settled import REPLAN_SECONDS
from tests.cli.conftest import Hai, json_out
from tests.cli.test_live import as_user, created_id, wait_for
from tests.support.live_server import LiveServer

LONG_JOB = "import time\nwhile True:\n    time.sleep(1)\n"


def submit(hai: Hai, server: LiveServer, user: str, code: Path, name: str, command: str) -> int:
    made = hai(
        "submit", "standalone", f"--name={name}", "--gpus=8", f"--code-dir={code}", command,
        env=as_user(server, user),
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    return created_id(made.stdout)


def queue_until(hai: Hai, server: LiveServer, done: Any) -> list[dict[str, Any]]:
    """`hai queue --json` as the admin until `done(entries)`: the controller measures use every
    MEASURE_SECONDS and a settled cluster is planned again every REPLAN_SECONDS."""
    deadline = time.monotonic() + 3 * (MEASURE_SECONDS + REPLAN_SECONDS)
    while True:
        entries: list[dict[str, Any]] = json_out(hai("queue", "--json", env=as_user(server, "admin")))
        if done(entries) or time.monotonic() > deadline:
            return entries
        time.sleep(0.5)


def _ids(entries: list[dict[str, Any]]) -> list[int]:
    return [e["job"]["id"] for e in entries]


@pytest.fixture
def flood(hai: Hai, clean: LiveServer, tmp_path: Path) -> tuple[int, int]:
    """Alice runs on every GPU, then queues one more low job; dave queues one after hers."""
    (tmp_path / "long.py").write_text(LONG_JOB, encoding="utf-8")
    running = submit(hai, clean, "alice", tmp_path, "alice-runs", "python3 long.py")
    wait_for(clean, running, {"RUNNING"})
    alices = submit(hai, clean, "alice", tmp_path, "alice-next", "true")
    daves = submit(hai, clean, "dave", tmp_path, "dave-one", "true")
    return alices, daves


def test_daves_low_job_goes_ahead_of_alices_older_one(
    hai: Hai, clean: LiveServer, flood: tuple[int, int]
) -> None:
    alices, daves = flood
    entries = queue_until(hai, clean, lambda es: _ids(es)[:2] == [daves, alices])
    assert _ids(entries)[:2] == [daves, alices], entries


def test_hai_queue_shows_the_fair_share_term(hai: Hai, clean: LiveServer, flood: tuple[int, int]) -> None:
    alices, daves = flood

    def term(entries: list[dict[str, Any]], job_id: int) -> float | None:
        entry = next(e for e in entries if e["job"]["id"] == job_id)
        return next((t["value"] for t in entry["terms"] if t["name"] == "fair share"), None)

    entries = queue_until(hai, clean, lambda es: (term(es, alices) or 0) < (term(es, daves) or 0))
    assert (term(entries, alices) or 0) < (term(entries, daves) or 0), entries
    table = hai("queue", "--explain", str(daves), env=as_user(clean, "dave"))
    assert table.exit_code == 0 and "fair share" in table.stdout, table.output
