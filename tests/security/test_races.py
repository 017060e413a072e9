"""Races between a check and a use, run under the race harness (tests/security/race.py)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.security.race import Flipper
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer

SUBMITS = 200


@pytest.fixture
def server(tmp_path: Path, store_env: dict[str, str]) -> Iterator[LiveServer]:
    with LiveServer(tmp_path / "hai", TEST_CONFIG, store_env).start() as live:
        yield live


def never_placed(code: Path, name: str) -> dict[str, object]:
    """A CPU job no node can hold: refused by the planner, so the test starts no process."""
    return {"mode": "cpu", "task_name": name, "code_path": str(code), "cmd": "true", "cpus": 1000}


def test_one_users_race_never_fails_another_users_submissions(server: LiveServer, tmp_path: Path) -> None:
    """Finding 6: bob swaps his own code path while he and alice submit; a check that meets the swap
    is bob's own 4xx, and alice, uninvolved, gets every job accepted."""
    dave = tmp_path / "dave" / "code"
    dave.mkdir(parents=True)
    alice = tmp_path / "alice"
    alice.mkdir()
    answers: dict[str, Counter[int]] = {"alice": Counter(), "bob": Counter()}

    def submit(user: str, code: Path) -> None:
        with httpx.Client(base_url=f"{server.url}/api/v1", timeout=60) as http:
            for i in range(SUBMITS):
                body = {"spec": never_placed(code, f"{user}-{i}")}
                r = http.post("/jobs", json=body, headers={"Authorization": f"Bearer {TOKENS[user]}"})
                answers[user][r.status_code] += 1

    with Flipper(tmp_path / "bob" / "c2", dave) as flipper:
        threads = [
            threading.Thread(target=submit, args=("alice", alice)),
            threading.Thread(target=submit, args=("bob", flipper.path)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
    assert flipper.flips >= 500
    assert answers["alice"] == Counter({201: SUBMITS}), answers
    assert sum(answers["bob"].values()) == SUBMITS
    assert all(status < 500 for status in answers["bob"]), answers
