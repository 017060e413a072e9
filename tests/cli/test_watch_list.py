"""The task list's long-poll (`GET /jobs/revision`): `hai task --watch | cat` shows a task submitted
after the watch began at once, not at its next refresh; a revision moves only for the tasks the
caller may list."""

from __future__ import annotations

import select
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from httpx import Response

from hai_airflow.cli.watch import REFRESH_SECONDS
from tests.cli.conftest import Hai
from tests.cli.test_habits import hai_process, process_env, submit
from tests.support.live_server import LiveServer


@pytest.fixture
def code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "ok.py").write_text("print('done', flush=True)\n", encoding="utf-8")
    return code


def get(server: LiveServer, user: str | None, params: dict[str, object], timeout: float = 15) -> Response:
    headers = {"Authorization": f"Bearer {user}-token"} if user else {}
    return httpx.get(f"{server.url}/api/v1/jobs/revision", params=params, headers=headers, timeout=timeout)


def revision(
    server: LiveServer, user: str, after: str | None = None, timeout: float = 0
) -> tuple[str, float]:
    """The user's revision and how long the server held the request."""
    began = time.monotonic()
    params: dict[str, object] = {"timeout": timeout} | ({"after": after} if after else {})
    r = get(server, user, params, timeout + 15)
    assert r.status_code == 200, r.text
    return r.json()["revision"], time.monotonic() - began


def settled(server: LiveServer, user: str) -> str:
    """The user's revision once it stood still for a second."""
    now, _ = revision(server, user)
    for _ in range(30):
        later, _ = revision(server, user, after=now, timeout=1)
        if later == now:
            return now
        now = later
    raise AssertionError(f"{user}'s tasks never stood still")


def test_a_watched_list_shows_a_new_task_before_its_refresh(
    server: LiveServer, code: Path, tmp_path: Path, hai: Hai
) -> None:
    env = process_env(server, "alice", tmp_path)
    listing = subprocess.Popen(
        hai_process(["task", "--watch", "--no-headers"]),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert listing.stdout is not None
    try:
        time.sleep(2)  # the first frame is drawn and the long-polls are waiting
        new = submit(hai, env, code, "ok.py")
        submitted = time.monotonic()
        seen = ""
        while time.monotonic() - submitted < REFRESH_SECONDS / 2:
            ready, _, _ = select.select([listing.stdout], [], [], 0.2)
            if ready:
                seen += listing.stdout.readline()
                if any(line.split()[:1] == [str(new)] for line in seen.splitlines()):
                    break
        else:
            pytest.fail(f"task {new} not shown within {REFRESH_SECONDS / 2} s:\n{seen}")
    finally:
        listing.terminate()
        listing.communicate(timeout=30)


def test_a_revision_moves_for_the_callers_tasks_only(server: LiveServer, code: Path, hai: Hai) -> None:
    alice = settled(server, "alice")  # the first test's task has ended
    carol, _ = revision(server, "carol")  # administers vision: alice's and bob's tasks
    dave, _ = revision(server, "dave")  # nlp: neither
    same, held = revision(server, "alice", after=alice, timeout=1)
    assert same == alice and held >= 0.9, "nothing changed: held to the timeout"

    bob_env = process_env(server, "bob", code)
    submit(hai, bob_env, code, "ok.py")
    assert revision(server, "alice", after=alice, timeout=1)[0] == alice, "bob's task is not in alice's list"
    assert revision(server, "dave", after=dave, timeout=1)[0] == dave
    moved, took = revision(server, "carol", after=carol, timeout=30)
    assert moved != carol and took < 5

    alice_env = process_env(server, "alice", code)
    submit(hai, alice_env, code, "ok.py")
    assert revision(server, "alice", after=alice, timeout=30)[0] != alice


def test_the_revision_needs_a_token_and_a_sane_timeout(server: LiveServer) -> None:
    anonymous = get(server, None, {})
    assert anonymous.status_code == 401
    r = get(server, "alice", {"timeout": 601})
    assert r.status_code == 422 and "timeout" in r.text
