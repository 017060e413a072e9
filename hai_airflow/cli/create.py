"""`hai create`: submit a training job with the platform document's full set of flags, or from a job file."""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer

from hai_airflow import arrays
from hai_airflow.cli import flagtable, jobfields, jobspec
from hai_airflow.cli.columns import id_runs
from hai_airflow.cli.connection import ServerFlags, connect, exit_code_for
from hai_airflow.cli.flags import option, with_flags
from hai_airflow.cli.ids import complete_packages
from hai_airflow.cli.jobspec import (
    CodePathOption,
    CpusOption,
    GpuJobFlags,
    GpuTypeOption,
    ImageOption,
    JobFile,
    JobFlags,
    MemoryOption,
    MinWorkersOption,
    SubmitFlags,
    TaskNameOption,
    WorkerImageOption,
    build_spec,
    spec_from_file,
)
from hai_airflow.cli.output import OutputFlags, emit, fail, note, say, usage_error
from hai_airflow.cli.task import JOB_COLUMNS
from hai_airflow.cli.wait import wait_and_report

if TYPE_CHECKING:
    from collections.abc import Mapping

    from hai_airflow.spec import JobSpec

CREATE_FLAGS = jobfields.CREATE_FLAG_NAMES
DOCUMENT_ORDER = flagtable.CREATE_ORDER

if TYPE_CHECKING:
    ModeOption = Any
    ResourcePkgOption = Any
    CmdOption = Any
    WorkersOption = Any
    WorkerResourcePkgOption = Any
else:
    ModeOption = option(flagtable.MODE)
    ResourcePkgOption = option(flagtable.RESOURCE_PKG, autocompletion=complete_packages)
    CmdOption = option(flagtable.CMD)
    WorkersOption = option(flagtable.WORKERS)
    WorkerResourcePkgOption = option(flagtable.WORKER_RESOURCE_PKG, autocompletion=complete_packages)


FileOption = Annotated[
    typer.FileText | None,
    typer.Option(
        "--filename",
        "-f",
        metavar="FILE",
        encoding="utf-8",
        help="Create the task from a job file (- reads stdin): YAML or JSON whose keys are this command's "
        "flags (time_limit: 10m, array: 0-3%2), `mode` included; `hai task N -o yaml` prints one. It "
        "holds the whole task, so no job flag may stand beside it; --wait, --client-key, -o and the "
        "connection flags may.",
        show_default=False,
    ),
]


@with_flags(order=DOCUMENT_ORDER)
def create(
    ctx: typer.Context,
    task_name: TaskNameOption = None,
    mode: ModeOption = "standalone",
    code_path: CodePathOption = None,
    image: ImageOption = None,
    resource_pkg: ResourcePkgOption = None,
    cmd: CmdOption = None,
    workers: WorkersOption = None,
    min_workers: MinWorkersOption = None,
    worker_image: WorkerImageOption = None,
    worker_resource_pkg: WorkerResourcePkgOption = None,
    gpu_type: GpuTypeOption = None,
    cpus: CpusOption = None,
    memory: MemoryOption = None,
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
        job_file = _job_file(ctx, file)
        if job_file.array is not None and submit.array not in (None, job_file.array):
            usage_error(
                f"--array {submit.array} and the job file's array: {job_file.array} ask for two arrays. "
                "Give it in one place"
            )
        submit = dataclasses.replace(submit, array=job_file.array or submit.array)
        submit_and_report(job_file.spec, submit, connection, out)
        return
    given = {"task_name": task_name, "mode": mode, "code_path": code_path, "image": image, "cmd": cmd}
    given |= {"resource_pkg": resource_pkg, "workers": workers, "min_workers": min_workers}
    given |= {"worker_image": worker_image, "worker_resource_pkg": worker_resource_pkg, "gpu_type": gpu_type}
    given |= {"cpus": cpus, "memory": memory}
    values = {**given, **dataclasses.asdict(job), **dataclasses.asdict(gpu_job)}
    fields = jobspec.checked(jobfields.create_fields, values)
    spec = build_spec(mode, fields, CREATE_FLAGS, "create")
    submit_and_report(spec, submit, connection, out, "create", CREATE_FLAGS)


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


def _job_file(ctx: typer.Context, file: TextIO) -> JobFile:
    """The task in -f's file. Job flags beside it are refused rather than merged: the file is the whole
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


def submit_and_report(
    spec: JobSpec,
    submit: SubmitFlags,
    connection: ServerFlags,
    out: OutputFlags,
    command: str | None = None,
    flags: Mapping[str, str] | None = None,
) -> None:
    """Send the spec; print `created task ID` (the id last, for scripts), the id alone (-o name) or the
    whole job; with --wait, then wait for it and exit with its outcome. With `command` (`submit cpu`)
    the server's refusal names the command's `flags` and help, as the downloadable `hai` words it."""
    from hai_airflow.client import HaiError

    # A key of this command's own when none is given: a submit sent again (the server's database was
    # down for a moment) answers the task the first one made instead of making a second.
    key = submit.client_key or f"hai-cli-{uuid.uuid4().hex}"
    with connect(connection) as client:
        try:
            job = client.submit(spec, client_key=key, array=submit.array)
        except HaiError as error:
            if command is None:
                raise
            code = exit_code_for(error)
            field = error.field or ""
            words = jobfields.submit_refusal(error.message, field, code == 2, flags or {}, command)
            fail(words, code)
        ids = [job.id]
        if submit.array is not None:
            ids = sorted(j.id for j in client.jobs(array=job.id, limit=arrays.MAX_ELEMENTS))
            note(f"array {job.id}: {arrays.describe(arrays.parse(submit.array))}, tasks {id_runs(ids)}")
        if out.format in ("table", "wide"):
            say(f"created task {job.id}")
        elif not submit.wait:
            emit(job, JOB_COLUMNS, out=out)
        if submit.wait:
            code = wait_and_report(client, ids, None, submit.wait_timeout, out)
            raise typer.Exit(code)
