"""`make up` as a newcomer runs it: Airflow on loopback, its connection a service identity acting for
the person signed in, and Ctrl-C or SIGTERM stops every process it started, however impatient."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dev.demo.processes import processes_with
from hai_airflow.client import HaiClient
from tests.airflow.helpers import INCLUDE, REPO
from tests.support.live_server import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

DAG_ID = "hai_submit_training"


class Up:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.hai_port, self.airflow_port = free_port(), free_port()
        self.airflow = f"http://127.0.0.1:{self.airflow_port}"
        args = [
            "--up",
            "--home",
            str(home),
            "--port",
            str(self.hai_port),
            "--airflow-port",
            str(self.airflow_port),
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "HAI_"))}
        self.out = home.parent / "up.log"
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dev.demo", *args],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name} ---\n" + "\n".join(p.read_text(errors="replace").splitlines()[-30:])
            for p in [self.out, *sorted(self.home.glob("*.log"))]
            if p.exists()
        )

    def wait(self, check: object, timeout: float, what: str) -> object:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(httpx.HTTPError, OSError, ValueError, KeyError):
                result = check()  # type: ignore[operator]
                if result:
                    return result
            assert self.proc.poll() is None, f"make up exited while waiting for {what}:\n{self.logs()}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{self.logs()}"
            time.sleep(1)

    def processes(self) -> list[int]:
        """Every process that belongs to this stack: Airflow's, hai serve and its jobs."""
        markers = (f"AIRFLOW_HOME={self.home / 'airflow'}".encode(), f"HAI_HOME={self.home / 'hai'}".encode())
        notice = f"HAI_PREEMPT_NOTICE={self.home / 'hai'}/".encode()
        return processes_with(lambda v: v in markers or v.startswith(notice))


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    stack = Up(tmp_path / "up")
    try:
        yield stack
    finally:
        for pid in [stack.proc.pid, *stack.processes()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stack.proc.wait(30)


def listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) with a listening socket on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.rsplit(":", 1)
                if int(hex_port, 16) == port and state == "0A":
                    found.add(address)
    return found


def test_make_up_serves_on_loopback_acts_for_the_person_and_stops_everything(up: Up) -> None:
    health = f"{up.airflow}/api/v2/monitor/health"
    up.wait(lambda: httpx.get(health, timeout=5).status_code == 200, 300, "the Airflow api-server")
    assert listening(up.airflow_port) == {"0100007F"}, "Airflow listens beyond loopback"

    password_file = up.home / "airflow" / "simple_auth_manager_passwords.json.generated"
    password = json.loads(password_file.read_text())["admin"]
    token = httpx.post(
        f"{up.airflow}/auth/token", json={"username": "admin", "password": password}, timeout=30
    )
    api = httpx.Client(
        base_url=f"{up.airflow}/api/v2",
        headers={"Authorization": f"Bearer {token.json()['access_token']}"},
        timeout=30,
    )
    up.wait(lambda: api.get(f"/dags/{DAG_ID}").status_code == 200, 240, "the DAG to be parsed")
    conf = {"task_name": "from make up", "mode": "cpu", "code_path": str(INCLUDE), "cmd": "sleep 12"}
    run = api.post(f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf}).json()
    state = up.wait(
        lambda: (
            (s := api.get(f"/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}").json()["state"])
            in ("success", "failed")
            and s
        ),
        300,
        "the run to finish",
    )
    assert state == "success", up.logs()

    # the connection holds Airflow's service identity, which acted for the person who triggered
    person = (up.home / "person-token").read_text().strip()
    with HaiClient(server=f"http://127.0.0.1:{up.hai_port}", token=person) as client:
        (job,) = [j for j in client.jobs() if j.task_name == "from make up"]
        assert (job.user, job.submitted_via, job.state) == ("demo", "airflow", "SUCCEEDED")
    for name in ("person", "service", "jwt"):
        assert (up.home / f"{name}-token").stat().st_mode & 0o777 == 0o600

    assert len(up.processes()) >= 5, "the stack's processes are not all marked"
    started = time.monotonic()
    os.kill(up.proc.pid, signal.SIGINT)  # Ctrl-C
    time.sleep(0.5)
    os.kill(up.proc.pid, signal.SIGTERM)  # and an impatient second stop
    up.proc.wait(20)
    deadline = started + 15
    while up.processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    took = time.monotonic() - started
    assert up.processes() == [], f"left running after {took:.1f} s: {up.processes()}"
    assert took < 15, f"stopping took {took:.1f} s"
