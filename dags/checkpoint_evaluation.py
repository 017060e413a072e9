"""Evaluate each new checkpoint of the jobs that train into a model directory, as it appears.

The DAG is scheduled on the model directory's asset, whose watcher (a trigger in the triggerer)
asks the hai server for new checkpoints; each one it reports starts a run. Train into the
directory with ``model_dir=`` (operators, the web form) or ``hai create --model-dir``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, Param, task
from airflow.sdk.exceptions import AirflowSkipException

from hai_airflow.assets import checkpoints_in, watched_model_asset
from hai_airflow.triggers.checkpoint import checkpoint_step

INCLUDE = str(Path(__file__).resolve().parents[1] / "include")
MODEL_DIR = os.environ.get("HAI_EVAL_MODEL_DIR", "/tmp/hai-airflow/models/classifier")
"""The model directory watched (``HAI_EVAL_MODEL_DIR`` where the DAG is parsed)."""
POLL_SECONDS = float(os.environ.get("HAI_EVAL_POLL_SECONDS", "30"))
"""Seconds between the watcher's looks at the server."""
HAI_USER = os.environ.get("HAI_EVAL_HAI_USER") or None
"""Whose jobs the watcher sees when the connection is a service identity acting for users."""

with DAG(
    dag_id="checkpoint_evaluation",
    description="Runs for each new checkpoint the hai server records in a model directory, and scores it.",
    schedule=watched_model_asset(MODEL_DIR, hai_user=HAI_USER, poll_interval=POLL_SECONDS),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["hai", "example"],
    params={
        "checkpoint": Param(
            "",
            type="string",
            description="A checkpoint to score when triggered by hand; runs the watcher starts "
            "score the checkpoints it reported.",
        ),
        "data": Param("", type="string", description="The job's .npz data; empty = the sample data."),
        "hidden": Param(32, type="integer", minimum=1, description="Hidden units of the sample model."),
        "seed": Param(0, type="integer", description="Seed of the sample data."),
    },
) as dag:

    @task
    def new_checkpoints(
        triggering_asset_events: Any = None, params: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """The checkpoints this run is for: those of the asset events that started it, or the form's."""
        extras = [event.extra for events in (triggering_asset_events or {}).values() for event in events]
        found = checkpoints_in(extras, MODEL_DIR)
        chosen = (params or {}).get("checkpoint")
        if chosen:
            found.append({"checkpoint": chosen, "step": checkpoint_step(chosen), "job_id": None})
        if not found:
            raise AirflowSkipException("no checkpoint to score: the run was started without one")
        return found

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
        # a training checkpoint keeps the weights under "model"; the final model is the weights alone
        model.load_state_dict(state.get("model", state))
        loss = full_loss(model, x, y)
        print(f"checkpoint {found['checkpoint']} (step {found['step']}): loss {loss:.4f}")
        return {**found, "loss": loss}

    evaluate.expand(found=new_checkpoints())
