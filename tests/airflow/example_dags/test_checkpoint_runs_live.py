"""The whole stack: the triggerer's watcher reports each checkpoint, the scheduler runs the DAG for it."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hai_airflow.spec import StandaloneJobSpec
from tests.airflow.helpers import INCLUDE
from tests.airflow.test_airflow_services import AirflowServices, poll
from tests.support.live_server import LiveServer

DAG_ID = "checkpoint_evaluation"


@pytest.fixture
def watched_services(hai_server: LiveServer, tmp_path: Path) -> Iterator[tuple[AirflowServices, Path]]:
    """Airflow's services with checkpoint_evaluation watching `tmp_path/models` every second, as alice
    (the services' connection is Airflow's service identity, which acts for her group)."""
    model_dir = tmp_path / "models"
    services = AirflowServices(tmp_path / "airflow", hai_server)
    services.env.update(
        {"HAI_EVAL_MODEL_DIR": str(model_dir), "HAI_EVAL_POLL_SECONDS": "1", "HAI_EVAL_HAI_USER": "alice"}
    )
    try:
        services.start()
        yield services, model_dir
    finally:
        services.stop()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_dag_run_per_checkpoint(
    watched_services: tuple[AirflowServices, Path], hai_server: LiveServer
) -> None:
    services, model_dir = watched_services
    api = services.api()
    poll(lambda: api.get(f"/dags/{DAG_ID}").status_code == 200, 240, "the DAG to be parsed", services.logs)

    with hai_server.client("alice-token") as client:
        # three checkpoints about 8 s apart (and final.pt), so each gets a run of its own
        job = client.submit(
            StandaloneJobSpec(
                task_name="watched by airflow",
                code_path=str(INCLUDE),
                cmd="python3 train.py --steps 30 --ckpt-every 10 --keep 20 --step-sleep 0.8",
                resource_pkg=454,
                model_dir=str(model_dir),
            )
        )
        poll(lambda: client.job(job.id).state == "SUCCEEDED", 300, "the training job", services.logs)
        events = client.job(job.id).events
    recorded = [e.reason.removeprefix("latest checkpoint ") for e in events if e.kind == "checkpoint"]
    assert len(recorded) >= 3, recorded

    def runs() -> list[dict[str, Any]]:
        return list(api.get(f"/dags/{DAG_ID}/dagRuns").json()["dag_runs"])

    def scored() -> list[str] | None:
        done = [r for r in runs() if r["state"] in ("success", "failed")]
        if len(done) < len(runs()):
            return None
        paths = []
        for run in done:
            entry = api.get(
                f"/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}/taskInstances/new_checkpoints/xcomEntries/return_value"
            )
            if entry.status_code == 200:
                paths += [c["checkpoint"] for c in entry.json()["value"]]
        return sorted(paths) if len(paths) >= len(recorded) else None

    evaluated = poll(scored, 600, "a run to score each checkpoint", services.logs)
    all_runs = runs()
    summary = "\n".join(f"{r['dag_run_id']}: {r['run_type']} {r['state']}" for r in all_runs)
    failed = [r["dag_run_id"] for r in all_runs if r["state"] != "success"]
    failed_logs = "".join(
        api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/evaluate/logs/1?map_index=0").text[-3000:]
        for run_id in failed
    )
    assert all(r["run_type"] == "asset_triggered" and r["state"] == "success" for r in all_runs), (
        summary + "\n" + failed_logs
    )
    # every checkpoint the server recorded is scored exactly once, in runs the watcher's events started
    assert evaluated == sorted(recorded), services.logs()
    assert len(all_runs) >= 2, summary
    # the triggerer kept the last checkpoint reported, so a restart would not report it again
    with sqlite3.connect(services.home / "airflow.db") as db:
        kept = dict(db.execute("select key, value from asset_state_store").fetchall())
    assert json.loads(kept[f"hai-checkpoint-watch:model dir {model_dir}"])["path"] == recorded[-1], kept
    print(f"{len(recorded)} checkpoints, {len(all_runs)} DAG runs:\n{summary}")
