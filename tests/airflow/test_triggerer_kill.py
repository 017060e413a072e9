"""Airflow's triggerer killed -9 while hai tasks are deferred on their jobs: a new triggerer takes the
triggers over once the dead one's heartbeat is stale, and each task ends with its job's outcome (one
succeeds, one fails), with the job's end in the task's log. Part of the faults tier."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.airflow.helpers import STANDALONE_FORM
from tests.airflow.services import AirflowServices, poll
from tests.faults.conftest import figures
from tests.support.live_server import LiveServer

__all__ = ["figures"]
pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(900)]
DAG_ID, TASK = "hai_submit_training", "submit_standalone"
STALE_SECONDS = 6
"""`[triggerer] triggerer_health_check_threshold` here: how old a triggerer's heartbeat must be before
another takes its triggers (30 s by default)."""


@pytest.fixture
def airflow_services(hai_server: LiveServer, tmp_path: Path) -> Iterator[AirflowServices]:
    services = AirflowServices(tmp_path / "airflow", hai_server)
    services.env["AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD"] = str(STALE_SECONDS)
    try:
        services.start()
        yield services
    finally:
        services.stop()


def test_a_new_triggerer_finishes_the_deferred_tasks_of_a_killed_one(
    airflow_services: AirflowServices, hai_server: LiveServer, figures: Callable[[str, float], None]
) -> None:
    api = airflow_services.api("alice")
    poll(lambda: api.get(f"/dags/{DAG_ID}").status_code == 200, 240, "the DAG", airflow_services.logs)
    form = {**STANDALONE_FORM, "max_schedule": 0}
    train = "python3 train.py --steps 30 --step-sleep 0.8"
    runs = {"succeeds": train, "fails": f"{train} && exit 3"}
    run_ids = {}
    for name, cmd in runs.items():
        conf = {**form, "task_name": f"triggerer kill {name}", "cmd": cmd}
        created = api.post(f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf})
        assert created.status_code == 200, created.text
        run_ids[name] = created.json()["dag_run_id"]

    def task(name: str) -> dict[str, object]:
        got: dict[str, object] = api.get(
            f"/dags/{DAG_ID}/dagRuns/{run_ids[name]}/taskInstances/{TASK}"
        ).json()
        return got

    poll(
        lambda: all(task(name).get("state") == "deferred" for name in runs),
        300,
        "both tasks to defer on their jobs",
        airflow_services.logs,
    )
    airflow_services.kill9("triggerer")
    airflow_services.start_service("triggerer")

    def finished() -> dict[str, str] | None:
        states = {name: str(task(name).get("state")) for name in runs}
        return states if all(s in ("success", "failed") for s in states.values()) else None

    states = poll(finished, 300, "the tasks to end", airflow_services.logs)
    assert states == {"succeeds": "success", "fails": "failed"}, airflow_services.logs()
    with hai_server.client("alice-token") as alice:
        jobs = {j.task_name: j for j in alice.jobs()}
    succeeded, failed = jobs["triggerer kill succeeds"], jobs["triggerer kill fails"]
    assert (succeeded.state, failed.state) == ("SUCCEEDED", "FAILED")
    for name, job in (("succeeds", succeeded), ("fails", failed)):
        log = api.get(f"/dags/{DAG_ID}/dagRuns/{run_ids[name]}/taskInstances/{TASK}/logs/1").text
        assert f"hai job {job.id}: RUNNING -> {job.state}" in log, log[-3000:]
        assert job.ended_at is not None
        ended = datetime.fromisoformat(str(task(name)["end_date"]))
        figures(
            "triggerer kill -9: a deferred task ends after its job", (ended - job.ended_at).total_seconds()
        )
