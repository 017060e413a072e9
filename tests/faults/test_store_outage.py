"""The database stopped under a running server (a PostgreSQL of the test's own, fast shutdown: every
connection cut) for longer than the controller's lease: the API answers 503 with Retry-After, never a
500; `hai` says what it waits for and succeeds once the database is back; running jobs keep running;
a job that ended meanwhile is recorded; nothing is lost, duplicated or overcommitted (the ledger)."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from hai_airflow.server.store.lease import LEASE_SECONDS
from hai_airflow.spec import CpuJobSpec
from tests.cli.conftest import Hai
from tests.cli.test_live import as_user, wait_for
from tests.support.live_server import TEST_CONFIG, TOKENS, start_server
from tests.support.own_postgres import OwnPostgres

pytestmark = [pytest.mark.faults, pytest.mark.slow]
OUTAGE_SECONDS = LEASE_SECONDS + 5
"""Longer than the controller's lease: it cannot renew it while the database is gone."""


def status_of(url: str, token: str) -> tuple[int, str | None, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.headers.get("Retry-After"), answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.headers.get("Retry-After"), refused.read().decode()


def test_the_database_gone_for_longer_than_the_lease_loses_nothing(
    database: OwnPostgres, tmp_path: Path, hai: Hai, figures: Callable[[str, float], None]
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    with start_server(tmp_path / "hai", TEST_CONFIG, {"HAI_DATABASE_URL": database.url}) as server:
        alice = server.client(TOKENS["alice"])
        keeps = alice.submit(CpuJobSpec(task_name="keeps", code_path=str(code), cmd="sleep 600"))
        ends = alice.submit(CpuJobSpec(task_name="ends", code_path=str(code), cmd="sleep 4"))
        wait_for(server, keeps.id, {"RUNNING"})
        wait_for(server, ends.id, {"RUNNING"})
        (first,) = alice.instances(keeps.id)

        database.stop()
        stopped = time.monotonic()
        status, retry_after, body = status_of(f"{server.url}/api/v1/jobs", TOKENS["alice"])
        assert (status, retry_after) == (503, "5"), body
        assert "database is unavailable" in body and "Traceback" not in body

        def restart() -> None:
            database.start()
            back_at = time.monotonic()
            while status_of(f"{server.url}/api/v1/jobs", TOKENS["alice"])[0] != 200:
                time.sleep(0.05)
            figures("database back: API answers", time.monotonic() - back_at)
            job_url = f"{server.url}/api/v1/jobs/{ends.id}"
            while '"state":"SUCCEEDED"' not in status_of(job_url, TOKENS["alice"])[2]:
                time.sleep(0.05)
            figures("database back: an exit of the outage recorded", time.monotonic() - back_at)

        back = threading.Timer(OUTAGE_SECONDS, restart)
        back.start()
        try:
            listed = hai("task", "--all", env=as_user(server, "alice"))
        finally:
            back.join()
        assert listed.exit_code == 0, listed.output
        assert "hai: the hai server's database is unavailable; retrying in" in listed.stderr
        assert time.monotonic() - stopped >= OUTAGE_SECONDS
        assert {"keeps", "ends"} <= set(listed.stdout.split())

        assert wait_for(server, ends.id, {"SUCCEEDED"}, timeout=90).state == "SUCCEEDED"
        assert alice.job(keeps.id).state == "RUNNING"
        assert alice.instances(keeps.id) == [first]  # the same run: never stopped, never started twice
        after = alice.submit(CpuJobSpec(task_name="after", code_path=str(code), cmd="true"))
        wait_for(server, after.id, {"SUCCEEDED"}, timeout=60)
        assert server.client(TOKENS["admin"]).check_store().problems == []
        log = server.log_text()
        assert "Traceback" not in log and "the store is back after" in log
