"""`hai serve` killed -9 twenty times in a row at random moments while a client submits without pause
and short jobs start, run and end: each submission, sent again with its key until the server takes
it, makes exactly one job; every job ends SUCCEEDED (an instance killed with its server before its
handle was saved is lost and its job runs again); the ledger finds nothing."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hai_airflow.client import HaiUnreachable
from hai_airflow.spec import TERMINAL_STATES, CpuJobSpec
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer
from tests.support.own_postgres import OwnPostgres

pytestmark = [pytest.mark.faults, pytest.mark.slow]
KILLS = 20
SEED = 20261206


class Submitter:
    """Submits one job after another, each with a key of its own, sending it again while no server
    answers; records which keys it submitted and which jobs answered them."""

    def __init__(self, server: LiveServer, code: Path) -> None:
        self.server, self.code = server, code
        self.answers: dict[str, set[int]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="submitter", daemon=True)

    def _run(self) -> None:
        n = 0
        with self.server.client(TOKENS["alice"]) as alice:
            alice.retry_for = 0
            while not self.stop.is_set():
                n += 1
                key = f"kill-loop-{n}"
                spec = CpuJobSpec(task_name=key, code_path=str(self.code), cmd="sleep 0.3", cpus=0.5)
                self.answers[key] = set()
                while not self.stop.is_set():
                    try:
                        self.answers[key].add(alice.submit(spec, client_key=key).id)
                        break
                    except HaiUnreachable:
                        time.sleep(0.05)
                time.sleep(0.05)


def test_twenty_kill_9s_in_a_row_lose_and_duplicate_nothing(
    database: OwnPostgres, tmp_path: Path, figures: Callable[[str, float], None]
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    rng = random.Random(SEED)
    server = LiveServer(tmp_path / "hai", TEST_CONFIG, {"HAI_DATABASE_URL": database.url}).start()
    submitter = Submitter(server, code)
    try:
        submitter.thread.start()
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.2, 1.5))
            server.kill9()
            killed = time.monotonic()
            server.start(wait_controller=False)
            figures("kill -9: the restarted server answers", time.monotonic() - killed)
        time.sleep(1.0)
        submitter.stop.set()
        submitter.thread.join(30)
        with server.client(TOKENS["alice"]) as alice:
            deadline = time.monotonic() + 120
            while True:
                jobs = alice.jobs(limit=100_000)
                if all(j.state in TERMINAL_STATES for j in jobs) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            by_key: dict[str, list[int]] = {}
            for j in jobs:
                by_key.setdefault(str(j.task_name), []).append(j.id)
        answered = {k: ids for k, ids in submitter.answers.items() if ids}
        assert len(answered) >= KILLS, "too few submissions got through to mean anything"
        assert all(len(ids) == 1 for ids in answered.values()), "a key was answered with two jobs"
        assert all(len(by_key.get(k, [])) == 1 for k in answered), "a submission was lost or stored twice"
        assert {j.state for j in jobs} == {"SUCCEEDED"}, [
            (j.id, j.state, j.reason) for j in jobs if j.state != "SUCCEEDED"
        ]
        assert server.client(TOKENS["admin"]).check_store().problems == []
    finally:
        submitter.stop.set()
        server.close()
