"""`hai create`: submit a training job with the platform document's full set of flags."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import typer

from hai_airflow.cli.connection import JsonOption, ServerOption, connect
from hai_airflow.cli.jobspec import (
    REQUIRED,
    ClientKeyOption,
    CodeSrcOption,
    ElasticOption,
    EnvOption,
    GitBranchOption,
    GpuTypeOption,
    GraceOption,
    MaxScheduleOption,
    ModelDirOption,
    ModelIdOption,
    ProjectIdOption,
    ProjectStorageOption,
    ShmOption,
    build_spec,
    parse_env,
)
from hai_airflow.cli.output import emit, say
from hai_airflow.cli.task import JOB_COLUMNS
from hai_airflow.spec import JobSpec

CREATE_FLAGS = {"grace_seconds": "--grace"}


def create(
    task_name: Annotated[
        str,
        typer.Option(
            "--task-name",
            metavar="TEXT",
            help="Task name; Chinese and English both work. 任务名称，支持中英文",
        ),
    ] = REQUIRED,
    model_id: ModelIdOption = None,
    project_id: ProjectIdOption = None,
    mode: Annotated[
        Literal["standalone", "distributed"],
        typer.Option(
            "--mode",
            metavar="[standalone|distributed]",
            help="Training mode: standalone (one machine, one or more GPUs) or distributed (Horovod: "
            "--workers machines of --worker-resource-pkg each). 训练模式: 单机等",
        ),
    ] = "standalone",
    code_src: CodeSrcOption = "nas",
    code_path: Annotated[
        str,
        typer.Option(
            "--code-path",
            metavar="TEXT",
            help="Code directory (the job starts cd'd there) or git repository. 代码路径",
        ),
    ] = REQUIRED,
    git_branch: GitBranchOption = None,
    model_dir: ModelDirOption = None,
    project_storage: ProjectStorageOption = None,
    max_schedule: MaxScheduleOption = 0,
    image: Annotated[
        str | None,
        typer.Option(
            "--image",
            metavar="TEXT",
            help="Docker image of the job. Default: local (run without a container). docker镜像地址",
        ),
    ] = None,
    resource_pkg: Annotated[
        int | None,
        typer.Option(
            "--resource-pkg",
            metavar="INTEGER",
            help="Resource package id; list them with `hai res`. For --mode distributed it is the "
            "package of one worker unless --worker-resource-pkg is given. 资源套餐ID，请用hai res获取",
        ),
    ] = None,
    shm: ShmOption = None,
    cmd: Annotated[
        str,
        typer.Option("--cmd", metavar="TEXT", help='Start command, e.g. "python3 training.py". 启动命令'),
    ] = REQUIRED,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            metavar="INTEGER",
            help="Distributed only: number of workers; total GPUs = workers x GPUs of the worker package. "
            "worker数目",
        ),
    ] = None,
    worker_image: Annotated[
        str | None,
        typer.Option(
            "--worker-image",
            metavar="TEXT",
            help="Distributed only: image of each worker (must have Horovod). Default: --image. worker镜像",
        ),
    ] = None,
    worker_resource_pkg: Annotated[
        int | None,
        typer.Option(
            "--worker-resource-pkg",
            metavar="INTEGER",
            help="Distributed only: resource package of one worker, usually a whole 8-GPU machine. "
            "worker资源组",
        ),
    ] = None,
    gpu_type: GpuTypeOption = None,
    elastic: ElasticOption = False,
    grace: GraceOption = None,
    env: EnvOption = None,
    client_key: ClientKeyOption = None,
    server: ServerOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a training task (创建托管训练任务). Prints `created task ID`; --json prints the whole job.

    \b
    Example:
    hai create --task-name=hai-test --model-id=31 --project-id=10209
    --code-path=/workspace/nas-data --project-storage=10209,10210 --max-schedule=24
    --image=registry/platform_horovod:v1.1 --resource-pkg=457 --cmd="python3 training.py"
    """
    fields: dict[str, Any] = {
        "task_name": task_name,
        "model_id": model_id,
        "project_id": project_id,
        "code_src": code_src,
        "code_path": code_path,
        "git_branch": git_branch,
        "model_dir": model_dir,
        "project_storage": project_storage,
        "max_schedule": max_schedule,
        "image": image,
        "shm": shm,
        "cmd": cmd,
        "env": parse_env(env),
        "elastic": elastic,
        "grace_seconds": grace,
        "gpu_type": gpu_type,
    }
    if mode == "distributed":
        fields |= {
            "workers": workers,
            "worker_image": worker_image,
            "worker_resource_pkg": worker_resource_pkg if worker_resource_pkg is not None else resource_pkg,
        }
    else:
        # Passed through so the spec itself refuses worker flags on a standalone job, naming the flag.
        fields |= {
            "resource_pkg": resource_pkg,
            "workers": workers,
            "worker_image": worker_image,
            "worker_resource_pkg": worker_resource_pkg,
        }
    spec = build_spec(mode, fields, CREATE_FLAGS, "create")
    submit_and_report(spec, client_key, server, as_json)


def submit_and_report(spec: JobSpec, client_key: str | None, server: str | None, as_json: bool) -> None:
    """Send the spec; print `created task ID` (the id last, for scripts) or the whole job as JSON."""
    with connect(server) as client:
        job = client.submit(spec, client_key=client_key)
    if as_json:
        emit(job, JOB_COLUMNS, as_json=True)
    else:
        say(f"created task {job.id}")
