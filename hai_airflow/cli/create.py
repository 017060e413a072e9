"""`hai create`: submit a training job with the platform document's full set of flags."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import typer

from hai_airflow.cli.connection import ServerFlags, connect
from hai_airflow.cli.flags import choice, completes, with_flags
from hai_airflow.cli.jobspec import (
    REQUIRED,
    GpuJobFlags,
    GpuTypeOption,
    JobFlags,
    SubmitFlags,
    build_spec,
)
from hai_airflow.cli.output import OutputFlags, emit, say
from hai_airflow.cli.task import JOB_COLUMNS
from hai_airflow.cli.wait import wait_and_report
from hai_airflow.spec import JobSpec

CREATE_FLAGS = {"grace_seconds": "--grace"}

DOCUMENT_ORDER = (
    "task_name", "model_id", "project_id", "mode", "code_src", "code_path", "git_branch", "model_dir",
    "project_storage", "max_schedule", "image", "resource_pkg", "shm", "cmd",
)  # fmt: skip
"""`hai create --help` lists the platform document's flags in the document's order, the rest after."""


@with_flags(order=DOCUMENT_ORDER)
def create(
    task_name: Annotated[
        str,
        typer.Option(
            "--task-name",
            metavar="TEXT",
            help="Task name; Chinese and English both work. 任务名称，支持中英文",
        ),
    ] = REQUIRED,
    mode: Annotated[
        Literal["standalone", "distributed"],
        typer.Option(
            "--mode",
            metavar="[standalone|distributed]",
            parser=choice("standalone", "distributed"),
            autocompletion=completes("standalone", "distributed"),
            help="Training mode: standalone (one machine, one or more GPUs) or distributed (Horovod: "
            "--workers machines of --worker-resource-pkg each). 训练模式: 单机等",
        ),
    ] = "standalone",
    code_path: Annotated[
        str,
        typer.Option(
            "--code-path",
            metavar="TEXT",
            help="Code directory (the job starts cd'd there) or git repository. 代码路径",
        ),
    ] = REQUIRED,
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
    job: JobFlags = JobFlags(),
    gpu_job: GpuJobFlags = GpuJobFlags(),
    submit: SubmitFlags = SubmitFlags(),
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """Create a training task (创建托管训练任务). Prints `created task ID`; -o json prints the whole job.

    \b
    Example:
    hai create --task-name=hai-test --model-id=31 --project-id=10209
    --code-path=/workspace/nas-data --project-storage=10209,10210 --max-schedule=24
    --image=registry/platform_horovod:v1.1 --resource-pkg=457 --cmd="python3 training.py" --wait
    """
    fields: dict[str, Any] = {
        "task_name": task_name,
        "code_path": code_path,
        "image": image,
        "cmd": cmd,
        "gpu_type": gpu_type,
        **job.fields(),
        **gpu_job.fields(),
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
    submit_and_report(spec, submit, connection, out)


def submit_and_report(spec: JobSpec, submit: SubmitFlags, connection: ServerFlags, out: OutputFlags) -> None:
    """Send the spec; print `created task ID` (the id last, for scripts), the id alone (-o name) or the
    whole job; with --wait, then wait for it and exit with its outcome."""
    with connect(connection) as client:
        job = client.submit(spec, client_key=submit.client_key)
        if out.format in ("table", "wide"):
            say(f"created task {job.id}")
        elif not submit.wait:
            emit(job, JOB_COLUMNS, out=out)
        if submit.wait:
            code = wait_and_report(client, [job.id], None, submit.wait_timeout, out)
            raise typer.Exit(code)
