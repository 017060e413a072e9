"""The whole stack: Airflow's api-server, scheduler, dag-processor and triggerer, and `hai serve`.

`hai_submit_training` is triggered through Airflow's REST API with a form in `conf`, the way the
Airflow UI's trigger page does, by two Airflow users; the connection's token is hai's service
identity for Airflow, so each job must be its triggering user's, under that user's quota, and the
dashboard inside Airflow must show each of them their own.
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

from tests.airflow.helpers import INCLUDE, REPO, SERVICE_TOKEN, connection_json
from tests.support.live_server import LiveServer, free_port

PASSWORD = "hai-slow-test-password"
DAG_ID = "hai_submit_training"
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


def hai_task(server: LiveServer, token: str) -> list[dict[str, Any]]:
    """`hai task -o json` as the token's user."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "hai"), "task", "-o", "json"],
        env={**os.environ, "HAI_SERVER": server.url, "HAI_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_each_airflow_user_submits_as_themselves_through_the_rest_api(
    airflow_services: AirflowServices, hai_server: LiveServer
) -> None:
    with hai_server.client() as admin:
        admin.set_user_quota("bob", 0)  # bob may submit only low priority
    api = {user: airflow_services.api(user) for user in ("alice", "bob")}
    poll(
        lambda: api["alice"].get(f"/dags/{DAG_ID}").status_code == 200,
        240,
        "the DAG to be parsed",
        airflow_services.logs,
    )

    form = {
        "mode": "standalone",
        "image": "local",
        "resource_pkg": 454,
        "gpu_type": "V100",
        "code_src": "nas",
        "code_path": str(INCLUDE),
    }
    # Long enough (about 14 s) that the deferral outlasts the ~10 s window in which Airflow's
    # LocalExecutor can wrongly fail a task that resumes from a short deferral (apache/airflow #71580).
    train = "python3 train.py --steps 20 --ckpt-every 10 --step-sleep 0.7"
    runs = {
        "alice high": ("alice", {**form, "task_name": "alice high", "max_schedule": 4, "cmd": train}),
        "bob high": ("bob", {**form, "task_name": "bob high", "max_schedule": 4, "cmd": train}),
        "bob low": ("bob", {**form, "task_name": "bob low", "max_schedule": 0, "cmd": train}),
    }
    run_ids = {}
    for name, (user, conf) in runs.items():
        created = api[user].post(f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf})
        assert created.status_code == 200, created.text
        run_ids[name] = created.json()["dag_run_id"]

    def finished() -> dict[str, str] | None:
        states = {
            name: api["alice"].get(f"/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"]
            for name, run_id in run_ids.items()
        }
        return states if all(s in ("success", "failed") for s in states.values()) else None

    states = poll(finished, 600, "the DAG runs to finish", airflow_services.logs)
    assert states == {"alice high": "success", "bob high": "failed", "bob low": "success"}, (
        airflow_services.logs()
    )

    def task_log(name: str) -> str:
        path = f"/dags/{DAG_ID}/dagRuns/{run_ids[name]}/taskInstances/submit_standalone/logs/1"
        return api["alice"].get(path).text

    # bob's high-priority request counted against his own quota (0), and the refusal is in his task log
    assert "high-priority quota does not cover 1 GPUs" in task_log("bob high")
    assert "acting for hai user bob (group vision) via airflow" in task_log("bob high")

    # each job is its triggering user's, submitted via the service; `hai task` shows each only theirs
    alice_jobs = hai_task(hai_server, "alice-token")
    bob_jobs = hai_task(hai_server, "bob-token")
    assert [(j["task_name"], j["user"], j["submitted_via"], j["priority"]) for j in alice_jobs] == [
        ("alice high", "alice", "airflow", "high")
    ]
    assert [(j["task_name"], j["user"], j["submitted_via"], j["priority"]) for j in bob_jobs] == [
        ("bob low", "bob", "airflow", "low")
    ]
    alice_job, bob_job = alice_jobs[0], bob_jobs[0]
    assert alice_job["state"] == "SUCCEEDED" and bob_job["state"] == "SUCCEEDED"
    assert str(alice_job["client_key"]).startswith(
        f"airflow:{DAG_ID}:submit_standalone:{run_ids['alice high']}"
    )

    # the task deferred, the triggerer followed the job for alice, and its lines are in the task's log
    log = task_log("alice high")
    assert f"submitted hai job {alice_job['id']}" in log
    assert f"hai job {alice_job['id']}: RUNNING -> SUCCEEDED" in log
    assert "done: loss" in log  # the job's log tail

    # the dashboard inside Airflow shows the signed-in Airflow user their own view
    pages = {user: airflow_services.api(user, base="/hai") for user in ("alice", "bob")}
    assert pages["alice"].get(f"/jobs/{alice_job['id']}").status_code == 200
    assert pages["bob"].get(f"/jobs/{bob_job['id']}").status_code == 200
    assert pages["bob"].get(f"/jobs/{alice_job['id']}").status_code in (403, 404)
    assert httpx.get(f"{airflow_services.url}/hai/queue", timeout=30).status_code == 401

    # the services mirrored the quotas into pools when they started
    pools = {p["name"]: p["slots"] for p in api["alice"].get("/pools").json()["pools"]}
    assert pools.get("hai_vision") == 8 and pools.get("hai_nlp") == 16
