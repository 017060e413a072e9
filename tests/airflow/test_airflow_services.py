"""The whole stack: Airflow's api-server, scheduler, dag-processor and triggerer, and `hai serve`.

`hai_submit_training` is triggered through Airflow's REST API with a form in `conf`, the way the
Airflow UI's trigger page does, by two Airflow users; the connection's token is hai's service
identity for Airflow, so each job must be its triggering user's, under that user's quota, and the
dashboard inside Airflow must show each of them their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.airflow.helpers import STANDALONE_FORM
from tests.airflow.services import AirflowServices, poll
from tests.support.live_server import LiveServer

DAG_ID = "hai_submit_training"


@pytest.fixture
def airflow_services(hai_server: LiveServer, tmp_path: Path) -> Iterator[AirflowServices]:
    services = AirflowServices(tmp_path / "airflow", hai_server)
    try:
        services.start()
        yield services
    finally:
        services.stop()


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

    form = STANDALONE_FORM
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
