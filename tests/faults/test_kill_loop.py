"""`hai serve` killed -9 twenty times in a row at random moments while a client submits without pause
and short jobs start, run and end: each submission, sent again with its key until the server takes
it, makes exactly one job; every job ends SUCCEEDED (an instance killed with its server before its
handle was saved is lost and its job runs again); the ledger finds nothing."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults.load import Submitter, Tally, all_ended, tally
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer
from tests.support.own_postgres import OwnPostgres

pytestmark = [pytest.mark.faults, pytest.mark.slow]
KILLS = 20
SEED = 20261206


def test_twenty_kill_9s_in_a_row_lose_and_duplicate_nothing(
    database: OwnPostgres,
    tmp_path: Path,
    figures: Callable[[str, float], None],
    accounts: Callable[[str, Tally, int], None],
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
            jobs = all_ended(alice)
        problems = server.client(TOKENS["admin"]).check_store().problems
        counted = tally(submitter, jobs)
        accounts("hai serve killed -9, 20 times", counted, len(problems))
        assert counted.submitted >= KILLS, "too few submissions got through to mean anything"
        assert counted.lost == counted.duplicated == counted.refused == 0, counted
        assert {j.state for j in jobs} == {"SUCCEEDED"}, [
            (j.id, j.state, j.reason) for j in jobs if j.state != "SUCCEEDED"
        ]
        assert problems == []
    finally:
        submitter.stop.set()
        server.close()
