"""A network partition between the controller's server and the database, with a second server on the
same database: the lease moves to the other server once it expires, that server finishes the work,
and the cut-off server, back on the network, finds the lease gone and never acts again (every
controller write renews the lease first, in its own transaction: the fence). Nothing is lost or done
twice (the ledger)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hai_airflow.server.store.lease import LEASE_SECONDS, RENEW_SECONDS
from hai_airflow.spec import CpuJobSpec
from tests.cli.test_live import wait_for
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer, start_server
from tests.support.own_postgres import OwnPostgres
from tests.support.tcp_proxy import Proxy

pytestmark = [pytest.mark.faults, pytest.mark.slow]


def until(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.2)


def controls(server: LiveServer) -> bool:
    try:
        return bool(server.health().get("controller_active"))
    except Exception:
        return False


def test_the_controller_cut_from_the_database_hands_over_and_is_fenced(
    database: OwnPostgres, tmp_path: Path, figures: Callable[[str, float], None]
) -> None:
    proxy = Proxy(("127.0.0.1", database.port))
    shared = {"HAI_TOKEN_KEY_FILE": str(tmp_path / "token.key")}
    through_proxy = database.url.replace(f":{database.port}/", f":{proxy.port}/")
    code = tmp_path / "code"
    code.mkdir()
    try:
        with start_server(tmp_path / "a", TEST_CONFIG, {**shared, "HAI_DATABASE_URL": through_proxy}) as a:
            until("server a to hold the lease", lambda: controls(a))
            with start_server(tmp_path / "b", TEST_CONFIG, {**shared, "HAI_DATABASE_URL": database.url}) as b:
                alice = b.client(TOKENS["alice"])
                keeps = alice.submit(CpuJobSpec(task_name="keeps", code_path=str(code), cmd="sleep 600"))
                ends = alice.submit(CpuJobSpec(task_name="ends", code_path=str(code), cmd="sleep 5"))
                wait_for(b, keeps.id, {"RUNNING"})
                wait_for(b, ends.id, {"RUNNING"})
                assert not controls(b)

                proxy.cut()
                cut_at = time.monotonic()
                until("server b to take the lease", lambda: controls(b), timeout=LEASE_SECONDS + 20)
                took = time.monotonic() - cut_at
                figures("partition: the other server takes over", took)
                # not before server a's lease ran out: its last renewal was at most RENEW_SECONDS before
                assert took >= LEASE_SECONDS - RENEW_SECONDS - 0.5, took
                wait_for(b, ends.id, {"SUCCEEDED"}, timeout=60)  # a's job, finished and recorded by b
                after = alice.submit(CpuJobSpec(task_name="after", code_path=str(code), cmd="true"))
                wait_for(b, after.id, {"SUCCEEDED"}, timeout=60)

                proxy.restore()
                restored = time.monotonic()
                holder = b.health()["this_server"]
                until("server a to answer again", lambda: a.health().get("lease_holder") == holder)
                figures(
                    "partition healed: the cut-off server sees it lost the lease", time.monotonic() - restored
                )
                time.sleep(LEASE_SECONDS / 2)  # long enough for a's controller to have tried to act
                assert not controls(a) and controls(b)
                assert "controller lease taken over by another server; standing by" in a.log_text()
                assert alice.job(keeps.id).state == "RUNNING" and len(alice.instances(keeps.id)) == 1
                alice.cancel(keeps.id)
                wait_for(b, keeps.id, {"CANCELLED"}, timeout=60)
                assert b.client(TOKENS["admin"]).check_store().problems == []
    finally:
        proxy.close()
