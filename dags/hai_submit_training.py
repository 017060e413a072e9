"""The web submission page: trigger this DAG from the Airflow UI; its form has the platform's fields."""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG, Param, task
from pydantic import ValidationError

from hai_airflow.operators.distributed import HaiDistributedTrainingOperator
from hai_airflow.operators.job import processes_field
from hai_airflow.operators.standalone import HaiStandaloneTrainingOperator
from hai_airflow.spec import PROCESSES_HELP, DistributedJobSpec, StandaloneJobSpec

RESOURCE_PACKAGES = {454: "1xV100", 455: "2xV100", 456: "4xV100", 457: "8xV100"}
"""The dropdown's packages (`hai res`); edit to match the cluster."""
GPU_TYPES = ["V100", "A100", "P100", "T4"]
DISTRIBUTED = "分布式训练 Distributed (multi-machine)"


def _package_choices() -> dict[str, Any]:
    return {
        "type": "integer",
        "enum": list(RESOURCE_PACKAGES),
        "values_display": {str(k): f"{v} ({k})" for k, v in RESOURCE_PACKAGES.items()},
    }


with DAG(
    dag_id="hai_submit_training",
    description="Submit a standalone or distributed training job to HAI (托管训练: Web页面提交).",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["hai", "submit"],
    params={
        "task_name": Param("hai-test", type="string", minLength=1, maxLength=200, title="任务名称 Task name"),
        "mode": Param(
            "standalone",
            type="string",
            enum=["standalone", "distributed"],
            values_display={"standalone": "单机训练 Standalone", "distributed": "分布式训练 Distributed"},
            title="模式 Mode",
        ),
        "image": Param("local", type="string", minLength=1, title="镜像 Image"),
        "resource_pkg": Param(454, title="资源组 Resource package", **_package_choices()),
        "gpu_type": Param("V100", type="string", enum=GPU_TYPES, title="GPU类型 GPU type"),
        "code_src": Param(
            "nas",
            type="string",
            enum=["nas", "git"],
            values_display={"nas": "个人存储 NAS", "git": "git仓库 Git"},
            title="代码来源 Code source",
        ),
        "code_path": Param(
            "/workspace/nas-data",
            type="string",
            minLength=1,
            title="代码地址 Code path",
            description="The job starts cd'd here (a NAS directory, or the git repository).",
        ),
        "cmd": Param("python3 train.py", type="string", minLength=1, title="训练启动命令 Start command"),
        "processes": Param(
            None,
            type=["null", "string"],
            enum=[None, "per-gpu", "per-worker"],
            values_display={
                None: "默认 Default for the mode (distributed: per-gpu, standalone: per-worker)",
                "per-gpu": "每个GPU一个进程 One per GPU (Horovod ranks, no launcher)",
                "per-worker": "每个worker一个进程 One per worker (torchrun, horovodrun, mpirun)",
            },
            title="进程数 Processes",
            description=PROCESSES_HELP,
        ),
        "workers": Param(
            2, type="integer", minimum=1, maximum=1024, title="worker数目 Workers", section=DISTRIBUTED
        ),
        "worker_image": Param(
            "",
            type="string",
            title="worker镜像 Worker image",
            description="Must support Horovod; empty = the image above.",
            section=DISTRIBUTED,
        ),
        "worker_resource_pkg": Param(
            457, title="worker资源组 Worker resource package", section=DISTRIBUTED, **_package_choices()
        ),
    },
) as dag:

    @task.branch
    def check_form(params: dict[str, Any] | None = None) -> str:
        """Validate the form as the platform would, naming the field to fix; pick the submit task."""
        form = dict(params or {})
        common = {
            "task_name": form["task_name"],
            "image": form["image"],
            "code_src": form["code_src"],
            "code_path": form["code_path"],
            "cmd": form["cmd"],
            "gpu_type": form["gpu_type"],
            **processes_field(form.get("processes")),
        }
        try:
            if form["mode"] == "distributed":
                DistributedJobSpec(
                    **common,
                    workers=form["workers"],
                    worker_image=form["worker_image"] or None,
                    worker_resource_pkg=form["worker_resource_pkg"],
                )
                return "submit_distributed"
            StandaloneJobSpec(**common, resource_pkg=form["resource_pkg"])
            return "submit_standalone"
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(map(str, err['loc'])) or 'form'}: {err['msg']}" for err in e.errors()
            )
            raise ValueError(f"the form is not valid: {problems}") from None

    common_args: dict[str, Any] = {
        "task_name": "{{ params.task_name }}",
        "image": "{{ params.image }}",
        "code_src": "{{ params.code_src }}",
        "code_path": "{{ params.code_path }}",
        "cmd": "{{ params.cmd }}",
        "gpu_type": "{{ params.gpu_type }}",
        # None (the mode's default) would render as the text "None".
        "processes": "{{ params.processes or '' }}",
    }
    submit_standalone = HaiStandaloneTrainingOperator(
        task_id="submit_standalone", resource_pkg="{{ params.resource_pkg }}", **common_args
    )
    submit_distributed = HaiDistributedTrainingOperator(
        task_id="submit_distributed",
        workers="{{ params.workers }}",
        worker_image="{{ params.worker_image }}",
        worker_resource_pkg="{{ params.worker_resource_pkg }}",
        **common_args,
    )
    check_form() >> [submit_standalone, submit_distributed]
