"""DAGs the Airflow tests run with dag.test(): one hai operator each, its command from `params.cmd`."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param

from hai_airflow.operators.cpu import HaiCpuJobOperator
from hai_airflow.operators.standalone import HaiStandaloneTrainingOperator
from hai_airflow.sensors.checkpoint import HaiCheckpointSensor
from hai_airflow.sensors.job import HaiJobSensor

START = pendulum.datetime(2026, 1, 1, tz="UTC")
CMD = {"cmd": Param("true", type="string")}


def cpu_dag(dag_id: str, **operator_args: object) -> DAG:
    with DAG(dag_id=dag_id, schedule=None, start_date=START, catchup=False, params=CMD) as dag:
        HaiCpuJobOperator(task_id="stage", code_path="/tmp", cmd="{{ params.cmd }}", **operator_args)  # type: ignore[arg-type]
    return dag


def high_priority_dag(dag_id: str, **operator_args: object) -> DAG:
    with DAG(dag_id=dag_id, schedule=None, start_date=START, catchup=False, params=CMD) as dag:
        HaiStandaloneTrainingOperator(
            task_id="train",
            code_path="/tmp",
            cmd="{{ params.cmd }}",
            gpus=1,
            max_schedule=4,
            resource_group="vision",
            quota_poll_interval=0.5,
            **operator_args,  # type: ignore[arg-type]
        )
    return dag


hai_deferred = cpu_dag("hai_deferred", deferrable=True)
hai_blocking = cpu_dag("hai_blocking", deferrable=False, log_tail_lines=1)
hai_reattach = cpu_dag("hai_reattach", deferrable=True)
hai_resubmit = cpu_dag("hai_resubmit")
hai_over_quota_fail = high_priority_dag("hai_over_quota_fail", on_over_quota="fail")
hai_over_quota_downgrade = high_priority_dag("hai_over_quota_downgrade", on_over_quota="downgrade")
hai_over_quota_wait = high_priority_dag("hai_over_quota_wait", on_over_quota="wait", deferrable=True)
hai_over_quota_wait_blocking = high_priority_dag(
    "hai_over_quota_wait_blocking", on_over_quota="wait", deferrable=False
)

with DAG(dag_id="hai_bad_spec", schedule=None, start_date=START, catchup=False) as hai_bad_spec:
    HaiStandaloneTrainingOperator(task_id="train", code_path="/tmp", cmd="true", gpus=16, retries=2)

WATCH = {
    "job_id": Param(0, type="integer"),
    "path": Param("", type="string"),
    "after_step": Param(-1, type="integer"),
}


def sensor_dag(dag_id: str, sensor: type, **sensor_args: object) -> DAG:
    with DAG(dag_id=dag_id, schedule=None, start_date=START, catchup=False, params=WATCH) as dag:
        sensor(task_id="wait", timeout=120, **sensor_args)
    return dag


hai_job_sensor_running = sensor_dag(
    "hai_job_sensor_running",
    HaiJobSensor,
    job_id="{{ params.job_id }}",
    target_states=["RUNNING"],
    deferrable=True,
)
hai_job_sensor_poke = sensor_dag(
    "hai_job_sensor_poke", HaiJobSensor, job_id="{{ params.job_id }}", deferrable=False, poke_interval=0.5
)
hai_checkpoint_sensor_path = sensor_dag(
    "hai_checkpoint_sensor_path",
    HaiCheckpointSensor,
    path="{{ params.path }}",
    after_step="{{ params.after_step }}",
    deferrable=False,
    poke_interval=0.5,
)
hai_checkpoint_sensor_job = sensor_dag(
    "hai_checkpoint_sensor_job",
    HaiCheckpointSensor,
    job_id="{{ params.job_id }}",
    after_step="{{ params.after_step }}",
    poke_interval=0.5,
    deferrable=True,
)

MODEL_DIR = "/tmp/hai-airflow-test-model"
"""A literal model dir, so the operator declares its asset as an outlet when the DAG is parsed."""
hai_model_asset = cpu_dag("hai_model_asset", model_dir=MODEL_DIR)
