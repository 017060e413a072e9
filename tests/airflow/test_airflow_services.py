"""The whole stack: Airflow's api-server, scheduler, dag-processor and triggerer, and `hai serve`.

`hai_submit_training` is triggered through Airflow's REST API with a form in `conf`, the way the
Airflow UI's trigger page does; the job must finish on hai and the run succeed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.airflow.helpers import INCLUDE, REPO, connection_json
from tests.support.live_server import LiveServer, free_port

PASSWORD = "hai-slow-test-password"
DAG_ID = "hai_submit_training"


class AirflowServices:
    """The four Airflow services in their own AIRFLOW_HOME (SQLite, LocalExecutor)."""

    def __init__(self, home: Path, hai: LiveServer) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        home.mkdir(parents=True, exist_ok=True)
        (home / "passwords.json").write_text(json.dumps({"admin": PASSWORD}))
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
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API_AUTH__JWT_SECRET": "hai-slow-test-jwt-secret-0123456789",
            "AIRFLOW__API__SECRET_KEY": "hai-slow-test-secret-key",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            "AIRFLOW_CONN_HAI_DEFAULT": connection_json(hai),
        }
        self.procs: list[subprocess.Popen[bytes]] = []

    def airflow(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "airflow", *args]

    def start(self) -> None:
        migrate = subprocess.run(
            self.airflow("db", "migrate"), env=self.env, capture_output=True, timeout=300
        )
        assert migrate.returncode == 0, migrate.stderr[-3000:]
        services = {
            "api-server": ("api-server", "--port", str(self.port), "--host", "127.0.0.1", "--workers", "1"),
            "scheduler": ("scheduler",),
            "dag-processor": ("dag-processor",),
            "triggerer": ("triggerer",),
        }
        for name, args in services.items():
            with open(self.home / f"{name}.log", "ab") as out:
                self.procs.append(
                    subprocess.Popen(
                        self.airflow(*args),
                        env=self.env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
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

    def api(self) -> httpx.Client:
        """A REST API client logged in as admin (waits for the api-server)."""
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(httpx.HTTPError):
                resp = httpx.post(
                    f"{self.url}/auth/token", json={"username": "admin", "password": PASSWORD}, timeout=10
                )
                if resp.status_code == 201:
                    token = resp.json()["access_token"]
                    return httpx.Client(
                        base_url=f"{self.url}/api/v2",
                        headers={"Authorization": f"Bearer {token}"},
                        timeout=30,
                    )
            assert time.monotonic() < deadline, "the api-server never answered:\n" + self.logs()
            assert all(p.poll() is None for p in self.procs), "an Airflow service exited:\n" + self.logs()
            time.sleep(1)


@pytest.fixture
def airflow_services(hai_server: LiveServer, tmp_path: Path) -> Iterator[AirflowServices]:
    services = AirflowServices(tmp_path / "airflow", hai_server)
    try:
        services.start()
        yield services
    finally:
        services.stop()


def poll(check: Callable[[], Any], timeout: float, what: str, logs: Callable[[], str]) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{logs()}"
        time.sleep(2)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_submit_page_through_the_rest_api(airflow_services: AirflowServices, hai_server: LiveServer) -> None:
    api = airflow_services.api()
    poll(
        lambda: api.get(f"/dags/{DAG_ID}").status_code == 200,
        240,
        "the DAG to be parsed",
        airflow_services.logs,
    )

    form = {
        "task_name": "triggered from the REST API",
        "mode": "standalone",
        "image": "local",
        "resource_pkg": 454,
        "gpu_type": "V100",
        "code_src": "nas",
        "code_path": str(INCLUDE),
        # Long enough (about 14 s) that the deferral outlasts the ~10 s window in which Airflow's
        # LocalExecutor can wrongly fail a task that resumes from a short deferral (apache/airflow #71580).
        "cmd": "python3 train.py --steps 20 --ckpt-every 10 --step-sleep 0.7",
    }
    created = api.post(f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": form})
    assert created.status_code == 200, created.text
    run_id = created.json()["dag_run_id"]

    def finished() -> str | None:
        state = api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"]
        return state if state in ("success", "failed") else None

    assert poll(finished, 600, "the DAG run to finish", airflow_services.logs) == "success", (
        airflow_services.logs()
    )

    tis = {
        ti["task_id"]: ti
        for ti in api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
    }
    assert tis["submit_standalone"]["state"] == "success" and tis["submit_distributed"]["state"] == "skipped"
    with hai_server.client() as client:
        (job,) = [j for j in client.jobs(all=True) if j.task_name == form["task_name"]]
    assert job.state == "SUCCEEDED" and job.client_key is not None
    assert job.client_key.startswith(f"airflow:{DAG_ID}:submit_standalone:{run_id}")
    # the task deferred, the triggerer followed the job, and its lines are in the task's log
    task_log = api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/submit_standalone/logs/1").text
    assert f"submitted hai job {job.id}" in task_log
    assert f"hai job {job.id}: RUNNING -> SUCCEEDED" in task_log
    assert "done: loss" in task_log  # the job's log tail
    # the services mirrored the quotas into pools when they started
    pools = {p["name"]: p["slots"] for p in api.get("/pools").json()["pools"]}
    assert pools.get("hai_vision") == 8 and pools.get("hai_nlp") == 16
