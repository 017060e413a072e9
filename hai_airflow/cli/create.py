"""`hai create`: submit a training job with the platform document's full set of flags, or from a job file."""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING, Annotated, Any, Literal, TextIO

import typer

from hai_airflow import arrays
from hai_airflow.cli.connection import ServerFlags, connect
from hai_airflow.cli.flags import choice, completes, with_flags
from hai_airflow.cli.ids import complete_packages
from hai_airflow.cli.jobspec import (
    CodePathOption,
    GpuJobFlags,
    GpuTypeOption,
    ImageOption,
    JobFlags,
    MinWorkersOption,
    SubmitFlags,
    TaskNameOption,
    WorkerImageOption,
    build_spec,
    image_fields,
    spec_from_file,
)
from hai_airflow.cli.output import OutputFlags, emit, note, say, usage_error
from hai_airflow.cli.task import JOB_COLUMNS
from hai_airflow.cli.wait import wait_and_report

if TYPE_CHECKING:
    from hai_airflow.spec import JobSpec

CREATE_FLAGS = {"grace_seconds": "--grace", "time_limit_seconds": "--time-limit"}

DOCUMENT_ORDER = (
    "task_name", "model_id", "project_id", "mode", "code_src", "code_path", "git_branch", "model_dir",
    "project_storage", "max_schedule", "image", "resource_pkg", "shm", "cmd",
)  # fmt: skip
"""`hai create --help` lists the platform document's flags in the document's order, the rest after."""


FileOption = Annotated[
    typer.FileText | None,
    typer.Option(
        "--filename",
        "-f",
        metavar="FILE",
        encoding="utf-8",
        help="Create the task from a job file (- reads stdin): YAML or JSON with the spec's fields, `mode` "
        "included; `hai task N -o yaml` prints one. It holds the whole task, so no job flag may stand "
        "beside it; --wait, --client-key, -o and the connection flags may.",
        show_default=False,
    ),
]


@with_flags(order=DOCUMENT_ORDER)
def create(
    ctx: typer.Context,
    task_name: TaskNameOption = None,
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
    code_path: CodePathOption = None,
    image: ImageOption = None,
    resource_pkg: Annotated[
        int | None,
        typer.Option(
            "--resource-pkg",
            autocompletion=complete_packages,
            metavar="INTEGER",
            help="Resource package id; list them with `hai res`. For --mode distributed it is the "
            "package of one worker unless --worker-resource-pkg is given. 资源套餐ID，请用hai res获取",
        ),
    ] = None,
    cmd: Annotated[
        str | None,
        typer.Option("--cmd", metavar="TEXT", help='Start command, e.g. "python3 training.py". 启动命令'),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            metavar="INTEGER",
            help="Distributed only: number of workers; total GPUs = workers x GPUs of the worker package. "
            "worker数目",
        ),
    ] = None,
    min_workers: MinWorkersOption = None,
    worker_image: WorkerImageOption = None,
    worker_resource_pkg: Annotated[
        int | None,
        typer.Option(
            "--worker-resource-pkg",
            autocompletion=complete_packages,
            metavar="INTEGER",
            help="Distributed only: resource package of one worker, usually a whole 8-GPU machine. "
            "worker资源组",
        ),
    ] = None,
    gpu_type: GpuTypeOption = None,
    job: JobFlags = JobFlags(),
    gpu_job: GpuJobFlags = GpuJobFlags(),
    file: FileOption = None,
    submit: SubmitFlags = SubmitFlags(),
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """Create a training task (创建托管训练任务). Prints `created task ID`; -o json prints the whole job.
    A task name, code path and command are required, unless -f gives a job file.

    \b
    Example:
    hai create --task-name=hai-test --model-id=31 --project-id=10209
    --code-path=/workspace/nas-data --project-storage=10209,10210 --max-schedule=24
    --image=registry/platform_horovod:v1.1 --resource-pkg=457 --cmd="python3 training.py" --wait
    hai task 42 -o yaml > job.yaml; hai create -f job.yaml
    """
    if file is not None:
        spec = _job_file_spec(ctx, file)
        submit_and_report(spec, submit, connection, out)
        return
    fields: dict[str, Any] = {
        "task_name": task_name,
        "code_path": code_path,
        "cmd": cmd,
        "gpu_type": gpu_type,
        **image_fields(mode, image, worker_image),
        **job.fields(),
        **gpu_job.fields(),
    }
    if mode == "distributed":
        fields |= {
            "workers": workers,
            "min_workers": min_workers,
            "worker_resource_pkg": worker_resource_pkg if worker_resource_pkg is not None else resource_pkg,
        }
    else:
        # Passed through so the spec itself refuses worker flags on a standalone job, naming the flag.
        fields |= {
            "resource_pkg": resource_pkg,
            "workers": workers,
            "min_workers": min_workers,
            "worker_resource_pkg": worker_resource_pkg,
        }
    spec = build_spec(mode, fields, CREATE_FLAGS, "create")
    submit_and_report(spec, submit, connection, out)


NOT_JOB_FLAGS = frozenset(
    {
        "file",
        *(f.name for group in (SubmitFlags, ServerFlags, OutputFlags) for f in dataclasses.fields(group)),
    }
)
"""What `hai create -f` takes beside the file: how to submit, where, and how to print the result."""


def _typed(ctx: typer.Context, name: str | None) -> bool:
    """Whether the command line gave this parameter (typer bundles its own click: the source's name)."""
    source = ctx.get_parameter_source(name or "")
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT", "PROMPT")


def _job_file_spec(ctx: typer.Context, file: TextIO) -> JobSpec:
    """The spec in -f's file. Job flags beside it are refused rather than merged: the file is the whole
    task, as `hai task N -o yaml` printed it, and nothing on the command line changes it unseen."""
    given = [p.opts[0] for p in ctx.command.params if p.name not in NOT_JOB_FLAGS and _typed(ctx, p.name)]
    if given:
        usage_error(
            f"{', '.join(given)} cannot be given with -f: the job file holds the whole task. Put "
            f"{'them' if len(given) > 1 else 'it'} in the file, or leave out -f"
        )
    source = "<stdin>" if file.name in ("<stdin>", "-") else file.name
    try:
        text = file.read()
    except UnicodeDecodeError:
        usage_error(f"{source} is not UTF-8 text. Save it as UTF-8")
    return spec_from_file(text, source)


def submit_and_report(spec: JobSpec, submit: SubmitFlags, connection: ServerFlags, out: OutputFlags) -> None:
    """Send the spec; print `created task ID` (the id last, for scripts), the id alone (-o name) or the
    whole job; with --wait, then wait for it and exit with its outcome."""
    # A key of this command's own when none is given: a submit sent again (the server's database was
    # down for a moment) answers the task the first one made instead of making a second.
    key = submit.client_key or f"hai-cli-{uuid.uuid4().hex}"
    with connect(connection) as client:
        job = client.submit(spec, client_key=key, array=submit.array)
        ids = [job.id]
        if submit.array is not None:
            ids = sorted(j.id for j in client.jobs(array=job.id, limit=arrays.MAX_ELEMENTS))
            note(f"array {job.id}: {arrays.describe(arrays.parse(submit.array))}, tasks {_id_runs(ids)}")
        if out.format in ("table", "wide"):
            say(f"created task {job.id}")
        elif not submit.wait:
            emit(job, JOB_COLUMNS, out=out)
        if submit.wait:
            code = wait_and_report(client, ids, None, submit.wait_timeout, out)
            raise typer.Exit(code)


def _id_runs(ids: list[int]) -> str:
    """`12-21` for consecutive ids, else them all: `12,14,15`."""
    if len(ids) > 1 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(map(str, ids))
