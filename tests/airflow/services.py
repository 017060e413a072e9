"""Airflow's four services (api-server, scheduler, dag-processor, triggerer) for the slow tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.airflow.helpers import REPO, SERVICE_TOKEN, connection_json
from tests.support.live_server import LiveServer, free_port

PASSWORD = "hai-slow-test-password"
AIRFLOW_USERS = ("admin", "alice", "bob")


class AirflowServices:
    """The four Airflow services in their own AIRFLOW_HOME (SQLite, LocalExecutor)."""

    def __init__(self, home: Path, hai: LiveServer) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        home.mkdir(parents=True, exist_ok=True)
        (home / "passwords.json").write_text(json.dumps(dict.fromkeys(AIRFLOW_USERS, PASSWORD)))
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(
                [
                    {
                        "name": "dags-folder",
                        "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                        "kwargs": {},
                    }
                ]
            ),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "2",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:admin" for u in AIRFLOW_USERS),
            "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API_AUTH__JWT_SECRET": "hai-slow-test-jwt-secret-0123456789",
            "AIRFLOW__API__SECRET_KEY": "hai-slow-test-secret-key",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            # Airflow's service identity: it acts for the vision group (alice, bob)
            "AIRFLOW_CONN_HAI_DEFAULT": connection_json(hai, SERVICE_TOKEN, user_map={}),
            # the pool sync reads every group's quota, which only an admin sees
            "AIRFLOW_CONN_HAI_ADMIN": connection_json(hai),
            "AIRFLOW__HAI__POOL_SYNC_CONN_ID": "hai_admin",
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def airflow(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "airflow", *args]

    def start(self) -> None:
        migrate = subprocess.run(
            self.airflow("db", "migrate"), env=self.env, capture_output=True, timeout=300
        )
        assert migrate.returncode == 0, migrate.stderr[-3000:]
        for name in self.SERVICES:
            self.start_service(name)

    SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer")

    def start_service(self, name: str) -> None:
        """Start one of SERVICES (again, after `kill9`)."""
        api = ("api-server", "--port", str(self.port), "--host", "127.0.0.1", "--workers", "1")
        args = {"api-server": api}
        with open(self.home / f"{name}.log", "ab") as out:
            self.procs[name] = subprocess.Popen(
                self.airflow(*args.get(name, (name,))),
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill9(self, name: str) -> None:
        """SIGKILL a service and every process it started."""
        proc = self.procs.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name} ---\n" + "\n".join(p.read_text(errors="replace").splitlines()[-40:])
            for p in sorted(self.home.glob("*.log"))
        )

    def api(self, user: str = "admin", base: str = "/api/v2") -> httpx.Client:
        """A client of `base` logged in as the Airflow `user` (waits for the api-server)."""
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(httpx.HTTPError):
                resp = httpx.post(
                    f"{self.url}/auth/token", json={"username": user, "password": PASSWORD}, timeout=10
                )
                if resp.status_code == 201:
                    token = resp.json()["access_token"]
                    return httpx.Client(
                        base_url=f"{self.url}{base}",
                        headers={"Authorization": f"Bearer {token}"},
                        timeout=30,
                    )
            assert time.monotonic() < deadline, "the api-server never answered:\n" + self.logs()
            exited = [name for name, p in self.procs.items() if p.poll() is not None]
            assert not exited, f"Airflow's {exited} exited:\n" + self.logs()
            time.sleep(1)


def poll(check: Callable[[], Any], timeout: float, what: str, logs: Callable[[], str]) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{logs()}"
        time.sleep(2)
