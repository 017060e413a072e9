"""`hai submit`: the short form that picks the resource package for you (as a CPU stage's command)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from hai_airflow.cli import flagtable, jobfields
from hai_airflow.cli.connection import ServerFlags, connect
from hai_airflow.cli.create import submit_and_report
from hai_airflow.cli.flags import argument, option, with_flags
from hai_airflow.cli.jobspec import (
    JOB_COMMAND,
    ONE_WORKER_COMMAND,
    CodePathOption,
    CpusOption,
    GpuJobFlags,
    ImageOption,
    JobFlags,
    MemoryOption,
    MinWorkersOption,
    SubmitFlags,
    TaskNameOption,
    WorkerImageOption,
    build_spec,
    checked,
    image_fields,
    join_command,
)
from hai_airflow.cli.output import OutputFlags, help_without_subcommand, note

if TYPE_CHECKING:
    from hai_airflow.spec import ResourcePackageView


def __getattr__(name: str) -> Any:
    # The scheduler's package rule, which `hai submit` applies, under its name here; importing the
    # scheduling package costs the planner, so only a caller that reads it pays.
    if name == "smallest_package":
        from hai_airflow.scheduling.packages import smallest_package

        return smallest_package
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


app = typer.Typer(
    help="Submit a job in the short form: give GPUs and GPU type, hai picks the resource package.",
    rich_markup_mode=None,
    invoke_without_command=True,
)


@app.callback()
def submit_group(ctx: typer.Context) -> None:
    """Submit a job in the short form: give GPUs and GPU type, hai picks the resource package."""
    help_without_subcommand(ctx)


SUBMIT_FLAGS = jobfields.SUBMIT_FLAG_NAMES

PLACEHOLDER_PACKAGE = 0
"""Stands in for the package while the flags are checked, before the server is asked for the real one."""

if TYPE_CHECKING:
    SubmitGpuTypeOption = Any
    CommandArgument = Any
    ExactOption = Any
    StandaloneGpusOption = Any
else:
    SubmitGpuTypeOption = option(flagtable.SUBMIT_GPU_TYPE)
    CommandArgument = argument(flagtable.COMMAND)
    ExactOption = option(flagtable.EXACT)
    StandaloneGpusOption = option(flagtable.STANDALONE_GPUS)
GpuAsk = jobfields.GpuAsk


def _package_for(packages: Sequence[ResourcePackageView], ask: GpuAsk) -> ResourcePackageView:
    """The smallest package of at least --gpus GPUs of --gpu-type; one holding more is named on
    stderr (stdout stays the result), or refused with --exact."""
    package, chosen = checked(jobfields.package_for, packages, ask)
    if chosen is not None:
        note(chosen)
    return package


def _submit_on_package(
    mode: Literal["standalone", "distributed"],
    package_field: str,
    fields: dict[str, Any],
    ask: GpuAsk,
    submit: SubmitFlags,
    connection: ServerFlags,
    out: OutputFlags,
) -> None:
    """Submit on the smallest package of --gpus GPUs of --gpu-type; the flags are checked before
    asking the server, so a bad flag is reported as such even when it is down."""
    build_spec(mode, {**fields, package_field: PLACEHOLDER_PACKAGE}, SUBMIT_FLAGS, f"submit {mode}")
    with connect(connection) as client:
        package = _package_for(client.resource_packages(), ask)
    fields = {**fields, package_field: package.id, "gpu_type": package.gpu_type}
    spec = build_spec(mode, fields, SUBMIT_FLAGS, f"submit {mode}")
    submit_and_report(spec, submit, connection, out, f"submit {mode}", SUBMIT_FLAGS)


@app.command(context_settings=ONE_WORKER_COMMAND)
@with_flags()
def standalone(
    task_name: TaskNameOption,
    code_path: CodePathOption,
    command: CommandArgument,
    gpus: StandaloneGpusOption = 1,
    gpu_type: SubmitGpuTypeOption = None,
    exact: ExactOption = False,
    image: ImageOption = None,
    job: JobFlags = JobFlags(),
    gpu_job: GpuJobFlags = GpuJobFlags(),
    submit: SubmitFlags = SubmitFlags(),
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """Single-machine training on --gpus GPUs of --gpu-type. Prints `created task ID`.

    \b
    Example (the platform document's):
    hai submit standalone --name=gpu-job --gpus=1 --worker-image=tensorflow/tensorflow:1.5.0-devel-gpu
    --gpu-type=p100 --code-dir=/workspace/cpfs-data/tensorflow-sample-code "python3 train.py"
    (--name, --code-dir and --worker-image are its spellings of --task-name, --code-path and --image.)
    """
    values = {"task_name": task_name, "code_path": code_path, "command": command, "image": image}
    values |= {**dataclasses.asdict(job), **dataclasses.asdict(gpu_job)}
    fields = checked(jobfields.short_form_fields, "standalone", values)
    ask = GpuAsk(gpus, gpu_type, exact)
    _submit_on_package("standalone", "resource_pkg", fields, ask, submit, connection, out)


@app.command(context_settings=JOB_COMMAND)
@with_flags()
def distributed(
    task_name: TaskNameOption,
    code_path: CodePathOption,
    command: CommandArgument,
    workers: Annotated[
        int,
        typer.Option(
            "--workers", metavar="INTEGER", help="Number of workers; total GPUs = workers x --gpus."
        ),
    ],
    gpus: Annotated[
        int, typer.Option("--gpus", metavar="INTEGER", help="GPUs per worker (8 = a whole machine).")
    ] = 8,
    min_workers: MinWorkersOption = None,
    gpu_type: SubmitGpuTypeOption = None,
    exact: ExactOption = False,
    image: ImageOption = None,
    worker_image: WorkerImageOption = None,
    job: JobFlags = JobFlags(),
    gpu_job: GpuJobFlags = GpuJobFlags(),
    submit: SubmitFlags = SubmitFlags(),
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """Multi-machine Horovod training: --workers workers of --gpus GPUs each. Prints `created task ID`.
    With --min-workers it is resizable: shrunk by whole workers rather than suspended, grown back later."""
    fields = {"task_name": task_name, "code_path": code_path, "cmd": join_command(command), **job.fields()}
    fields |= {**gpu_job.fields(), **image_fields("distributed", image, worker_image)}
    fields |= {"workers": workers, "min_workers": min_workers}
    ask = GpuAsk(gpus, gpu_type, exact, per_worker=True)
    _submit_on_package("distributed", "worker_resource_pkg", fields, ask, submit, connection, out)


@app.command(context_settings=ONE_WORKER_COMMAND)
@with_flags()
def cpu(
    task_name: TaskNameOption,
    code_path: CodePathOption,
    command: CommandArgument,
    cpus: CpusOption = None,
    memory: MemoryOption = None,
    image: ImageOption = None,
    job: JobFlags = JobFlags(),
    submit: SubmitFlags = SubmitFlags(),
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """A CPU stage, such as preprocessing, that holds no GPU; it may end by submitting the GPU stage."""
    values = {"task_name": task_name, "code_path": code_path, "command": command, "image": image}
    values |= {"cpus": cpus, "memory": memory, **dataclasses.asdict(job)}
    fields = checked(jobfields.short_form_fields, "cpu", values)
    spec = build_spec("cpu", fields, SUBMIT_FLAGS, "submit cpu")
    submit_and_report(spec, submit, connection, out, "submit cpu", SUBMIT_FLAGS)
