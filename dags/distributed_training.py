"""Distributed (Horovod / torch.distributed) training of the sample model on 2 workers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, Param, task

from hai_airflow.operators.distributed import HaiDistributedTrainingOperator

INCLUDE = str(Path(__file__).resolve().parents[1] / "include")
WORKDIR = "{{ params.data_dir }}/{{ run_id | replace(':', '') | replace('+', '') }}"

with DAG(
    dag_id="distributed_training",
    description="Data-parallel training on workers x GPUs; only rank 0 checkpoints.",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["hai", "example"],
    params={
        "workers": Param(2, type="integer", minimum=1, description="Number of workers."),
        "gpus_per_worker": Param(1, type="integer", enum=[1, 2, 4, 8], description="GPUs per worker."),
        "max_schedule": Param(0, type="integer", enum=[0, 4, 6, 8, 24, 48], description="0 = low priority."),
        "steps": Param(60, type="integer", minimum=1, description="Training steps."),
        "ckpt_every": Param(20, type="integer", minimum=1, description="Checkpoint every K steps."),
        "data_dir": Param(
            "/tmp/hai-airflow/distributed_training", type="string", description="Shared storage for the run."
        ),
    },
) as dag:
    train = HaiDistributedTrainingOperator(
        task_id="train",
        task_name="{{ dag.dag_id }}.train",
        code_path=INCLUDE,
        cmd=(
            "python3 train_distributed.py --steps {{ params.steps }} --ckpt-every {{ params.ckpt_every }} "
            f"--metrics '{WORKDIR}/metrics.json'"
        ),
        workers="{{ params.workers }}",
        gpus_per_worker="{{ params.gpus_per_worker }}",
        max_schedule="{{ params.max_schedule }}",
        model_dir=f"{WORKDIR}/model",
        metrics_path=f"{WORKDIR}/metrics.json",
    )

    @task
    def report(result: dict[str, Any]) -> dict[str, Any]:
        """Read the metrics rank 0 wrote."""
        metrics = json.loads(Path(result["metrics_path"]).read_text(encoding="utf-8"))
        print(f"hai job {result['job_id']}: {metrics}")
        return {**metrics, "job_id": result["job_id"]}

    report(train.output)  # type: ignore[arg-type]  # an XCom at parse time
