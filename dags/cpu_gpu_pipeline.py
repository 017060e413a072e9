"""CPU-GPU staged training: a CPU preprocessing job, then a GPU training job, then an evaluation."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, Param, task

from hai_airflow.operators.cpu import HaiCpuJobOperator
from hai_airflow.operators.standalone import HaiStandaloneTrainingOperator

INCLUDE = str(Path(__file__).resolve().parents[1] / "include")
WORKDIR = "{{ params.data_dir }}/{{ run_id | replace(':', '') | replace('+', '') }}"

with DAG(
    dag_id="cpu_gpu_pipeline",
    description="Preprocess on CPU, train on a GPU (suspended and resumed as the platform decides), evaluate",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["hai", "example"],
    params={
        "max_schedule": Param(
            0,
            type="integer",
            enum=[0, 4, 6, 8, 24, 48],
            description="Expected queueing hours of the training job: 0 = low priority, more = high.",
        ),
        "steps": Param(200, type="integer", minimum=1, description="Training steps."),
        "ckpt_every": Param(20, type="integer", minimum=1, description="Checkpoint every K steps."),
        "step_sleep": Param(0.0, type="number", minimum=0, description="Seconds to pause after each step."),
        "gpus": Param(1, type="integer", enum=[1, 2, 4, 8], description="GPUs of the training job."),
        "samples": Param(1024, type="integer", minimum=16, description="Samples the CPU stage makes."),
        "max_loss": Param(2.0, type="number", description="Evaluation fails above this final loss."),
        "data_dir": Param(
            "/tmp/hai-airflow/cpu_gpu_pipeline", type="string", description="Shared storage for the run."
        ),
    },
) as dag:
    preprocess = HaiCpuJobOperator(
        task_id="preprocess",
        task_name="{{ dag.dag_id }}.preprocess",
        code_path=INCLUDE,
        cmd=f"python3 preprocess.py '{WORKDIR}/data.npz' --samples {{{{ params.samples }}}}",
        cpus=2,
    )

    train = HaiStandaloneTrainingOperator(
        task_id="train",
        task_name="{{ dag.dag_id }}.train",
        code_path=INCLUDE,
        cmd=(
            f"python3 train.py --data '{WORKDIR}/data.npz' --steps {{{{ params.steps }}}} "
            "--ckpt-every {{ params.ckpt_every }} --step-sleep {{ params.step_sleep }} "
            f"--metrics '{WORKDIR}/metrics.json'"
        ),
        gpus="{{ params.gpus }}",
        max_schedule="{{ params.max_schedule }}",
        model_dir=f"{WORKDIR}/model",
        metrics_path=f"{WORKDIR}/metrics.json",
    )

    @task
    def evaluate(result: dict[str, Any], params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Read the training job's metrics; fail when the loss is not a number or above `max_loss`."""
        metrics = json.loads(Path(result["metrics_path"]).read_text(encoding="utf-8"))
        loss = float(metrics["loss"])
        max_loss = float((params or {}).get("max_loss", 2.0))
        print(
            f"hai job {result['job_id']}: loss {loss:.4f} after {metrics['steps']} steps, "
            f"{result['preemptions']} preemption(s), resumed from step {metrics.get('resumed_from')}"
        )
        if not math.isfinite(loss) or loss > max_loss:
            raise ValueError(f"loss {loss} is above max_loss {max_loss}")
        return {**metrics, "job_id": result["job_id"], "preemptions": result["preemptions"]}

    preprocess >> train
    evaluate(train.output)  # type: ignore[arg-type]  # an XCom at parse time
