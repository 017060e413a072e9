"""Evaluate each new checkpoint of a running training job as it appears."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, Param, task

from hai_airflow.sensors.checkpoint import HaiCheckpointSensor

INCLUDE = str(Path(__file__).resolve().parents[1] / "include")
ROUNDS = 3
"""Checkpoints evaluated per run; trigger the DAG again (or raise this) for more."""

with DAG(
    dag_id="checkpoint_evaluation",
    description="A sensor waits for each newer checkpoint of a hai job; a task evaluates it.",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["hai", "example"],
    params={
        "job_id": Param(type="integer", minimum=1, description="The running training job (`hai task`)."),
        "after_step": Param(-1, type="integer", description="Only checkpoints past this step count."),
        "data": Param("", type="string", description="The job's .npz data; empty = the sample data."),
        "hidden": Param(32, type="integer", minimum=1, description="Hidden units of the sample model."),
        "seed": Param(0, type="integer", description="Seed of the sample data."),
    },
) as dag:

    @task
    def evaluate(found: dict[str, Any], params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Load the checkpoint into the sample model and compute its loss on the data."""
        import torch

        if INCLUDE not in sys.path:
            sys.path.insert(0, INCLUDE)
        from classifier import full_loss, load_data, make_model

        p = params or {}
        x, y = load_data(Path(p["data"]) if p.get("data") else None, int(p.get("seed", 0)))
        model = make_model(x.shape[1], int(y.max()) + 1, int(p.get("hidden", 32)), dropout=0.1)
        state = torch.load(found["checkpoint"], map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        loss = full_loss(model, x, y)
        print(f"checkpoint {found['checkpoint']} (step {found['step']}): loss {loss:.4f}")
        return {"checkpoint": found["checkpoint"], "step": found["step"], "loss": loss}

    previous: Any = None
    for i in range(1, ROUNDS + 1):
        after = (
            "{{ params.after_step }}"
            if previous is None
            else f"{{{{ ti.xcom_pull(task_ids='{previous.operator.task_id}')['step'] }}}}"
        )
        wait = HaiCheckpointSensor(
            task_id=f"wait_checkpoint_{i}",
            job_id="{{ params.job_id }}",
            after_step=after,
            poke_interval=5,
            timeout=6 * 3600,
        )
        if previous is not None:
            previous >> wait
        previous = evaluate.override(task_id=f"evaluate_{i}")(wait.output)  # type: ignore[arg-type]  # an XCom at parse time
