"""The web submission page: trigger this DAG from the Airflow UI; its form has the platform's fields."""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG, task

from hai_airflow.operators.cpu import HaiCpuJobOperator
from hai_airflow.operators.distributed import HaiDistributedTrainingOperator
from hai_airflow.operators.form import form_params, server_choices, spec_from_form
from hai_airflow.operators.standalone import HaiStandaloneTrainingOperator

with DAG(
    dag_id="hai_submit_training",
    description="Submit a CPU, standalone or distributed training job to HAI (托管训练: Web页面提交).",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["hai", "submit"],
    params=form_params(server_choices()),
) as dag:

    @task.branch
    def check_form(params: dict[str, Any] | None = None) -> str:
        """Validate the form as the platform would, naming the field to fix; pick the submit task."""
        return f"submit_{spec_from_form(params or {}).mode}"

    # An empty optional field is None, which would render as the text "None".
    common_args: dict[str, Any] = {
        "task_name": "{{ params.task_name }}",
        "max_schedule": "{{ params.max_schedule }}",
        "image": "{{ params.image }}",
        "code_src": "{{ params.code_src }}",
        "code_path": "{{ params.code_path }}",
        "git_branch": "{{ params.git_branch or '' }}",
        "cmd": "{{ params.cmd }}",
        "model_dir": "{{ params.model_dir or '' }}",
        "project_storage": "{{ params.project_storage or '' }}",
        "shm": "{{ params.shm or '' }}",
        # A web submission beyond quota is refused in the task log, never queued or downgraded silently.
        "on_over_quota": "fail",
    }
    gpu_args: dict[str, Any] = {
        "gpu_type": "{{ params.gpu_type or '' }}",
        "processes": "{{ params.processes or '' }}",
    }
    submit_standalone = HaiStandaloneTrainingOperator(
        task_id="submit_standalone", resource_pkg="{{ params.resource_pkg }}", **common_args, **gpu_args
    )
    submit_distributed = HaiDistributedTrainingOperator(
        task_id="submit_distributed",
        workers="{{ params.workers }}",
        min_workers="{{ params.min_workers or '' }}",
        worker_image="{{ params.worker_image or '' }}",
        worker_resource_pkg="{{ params.worker_resource_pkg }}",
        **common_args,
        **gpu_args,
    )
    submit_cpu = HaiCpuJobOperator(
        task_id="submit_cpu",
        cpus="{{ params.cpus or '' }}",
        memory_gb="{{ params.memory_gb or '' }}",
        **common_args,
    )
    check_form() >> [submit_standalone, submit_distributed, submit_cpu]
