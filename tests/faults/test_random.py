"""Faults at random under load: while alice submits without pause jobs of every mode (CPU, standalone
low and high priority, distributed over two nodes), the server is killed -9, its database stopped, or
cut off from it, one after another in an order drawn from a seed (`HAI_CHAOS_SEED`, which `make
chaos` varies per round). After each fault a job submitted has to run; at the end every submission is
stored exactly once or refused with a reason, every job SUCCEEDED and the ledger finds nothing."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hai_airflow.client import HaiUnreachable
from hai_airflow.spec import CpuJobSpec, DistributedJobSpec, JobSpec, StandaloneJobSpec
from tests.cli.test_live import wait_for
from tests.faults.load import Submitter, Tally, all_ended, tally
from tests.server.test_live import TWO_NODES
from tests.support.live_server import TOKENS, LiveServer
from tests.support.own_postgres import OwnPostgres
from tests.support.tcp_proxy import Proxy

pytestmark = [pytest.mark.faults, pytest.mark.slow]
FAULTS = 6
SEED = int(os.environ.get("HAI_CHAOS_SEED", "20261207"))


def every_mode(key: str, code: Path, n: int) -> JobSpec:
    """CPU, standalone low, standalone high (2 GPUs, within alice's quota of 8 but not four at once),
    distributed over two nodes, in turn."""
    common = {"task_name": key, "code_path": str(code), "cmd": "sleep 1"}
    return (
        CpuJobSpec(**common, cpus=0.5),
        StandaloneJobSpec(**common, resource_pkg=454, max_schedule=0),
        StandaloneJobSpec(**common, resource_pkg=455, max_schedule=4),
        DistributedJobSpec(**common, workers=2, worker_resource_pkg=454, max_schedule=0),
    )[n % 4]


class Faults:
    """What can go wrong, each ending with the part back."""

    def __init__(self, server: LiveServer, database: OwnPostgres, proxy: Proxy, rng: random.Random):
        self.server, self.database, self.proxy, self.rng = server, database, proxy, rng

    def server_killed(self) -> None:
        self.server.kill9()
        self.server.start(wait_controller=False)

    def database_stopped(self) -> None:
        self.database.stop()
        time.sleep(self.rng.uniform(2, 10))
        self.database.start()

    def partition(self) -> None:
        self.proxy.cut()
        time.sleep(self.rng.uniform(2, 10))
        self.proxy.restore()

    def all(self) -> dict[str, Callable[[], None]]:
        return {
            "server killed -9": self.server_killed,
            "database stopped": self.database_stopped,
            "server cut off from its database": self.partition,
        }


def probe(server: LiveServer, code: Path, n: int) -> None:
    """A job submitted now runs: the API, the controller and a worker all work again."""
    key = f"probe-{n}"
    with server.client(TOKENS["alice"]) as alice:
        while True:
            try:
                job = alice.submit(CpuJobSpec(task_name=key, code_path=str(code), cmd="true"), client_key=key)
                break
            except HaiUnreachable:
                time.sleep(0.1)
    wait_for(server, job.id, {"SUCCEEDED"}, timeout=120)


def test_faults_at_random_under_a_load_of_every_mode_lose_nothing(
    database: OwnPostgres,
    tmp_path: Path,
    figures: Callable[[str, float], None],
    accounts: Callable[[str, Tally, int], None],
) -> None:
    rng = random.Random(SEED)
    code = tmp_path / "code"
    code.mkdir()
    proxy = Proxy(("127.0.0.1", database.port))
    url = database.url.replace(f":{database.port}/", f":{proxy.port}/")
    server = LiveServer(tmp_path / "hai", TWO_NODES, {"HAI_DATABASE_URL": url}).start()
    submitter = Submitter(server, code, prefix="random", make=every_mode, retry_for=120)
    faults = Faults(server, database, proxy, rng).all()
    drawn = [rng.choice(sorted(faults)) for _ in range(FAULTS)]
    try:
        submitter.thread.start()
        for n, fault in enumerate(drawn):
            time.sleep(rng.uniform(1, 3))
            faults[fault]()
            back = time.monotonic()
            probe(server, code, n)
            figures(f"random faults: {fault}: a job submitted after it has run", time.monotonic() - back)
        submitter.stop.set()
        submitter.thread.join(150)
        assert not submitter.thread.is_alive(), "the submitter hung"
        with server.client(TOKENS["alice"]) as alice:
            jobs = [j for j in all_ended(alice, timeout=300) if not str(j.task_name).startswith("probe-")]
        problems = server.client(TOKENS["admin"]).check_store().problems
        counted = tally(submitter, jobs)
        accounts("random faults under load", counted, len(problems))
        print(f"seed {SEED}: {', '.join(drawn)}; {counted}")
        assert counted.submitted >= 10, counted
        assert counted.lost == counted.duplicated == 0, counted
        assert {j.state for j in jobs} == {"SUCCEEDED"}, [(j.id, j.state, j.reason) for j in jobs]
        assert problems == []
    finally:
        submitter.stop.set()
        server.close()
        proxy.close()
