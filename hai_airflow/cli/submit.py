"""`hai submit`: the short form that picks the resource package for you (as a CPU stage's command)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from hai_airflow.cli.connection import ServerFlags, connect
from hai_airflow.cli.create import submit_and_report
from hai_airflow.cli.flags import with_flags
from hai_airflow.cli.jobspec import (
    JOB_COMMAND,
    ONE_WORKER_COMMAND,
    CodePathOption,
    GpuJobFlags,
    ImageOption,
    JobFlags,
    MinWorkersOption,
    SubmitFlags,
    TaskNameOption,
    WorkerImageOption,
    build_spec,
    image_fields,
    join_command,
)
from hai_airflow.cli.output import OutputFlags, help_without_subcommand, note, usage_error

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


SUBMIT_FLAGS = {
    "resource_pkg": "--gpus",
    "worker_resource_pkg": "--gpus",
    "cmd": "CMD",
    "grace_seconds": "--grace",
    "time_limit_seconds": "--time-limit",
    "memory_gb": "--memory",
}

PLACEHOLDER_PACKAGE = 0
"""Stands in for the package while the flags are checked, before the server is asked for the real one."""

SubmitGpuTypeOption = Annotated[
    str | None,
    typer.Option(
        "--gpu-type", metavar="TEXT", help="GPU type, any case (v100, A100, p100, T4...). Default: any type."
    ),
]
CommandArgument = Annotated[
    list[str],
    typer.Argument(
        metavar="CMD", help='Start command, quoted: "python3 train.py --lr 0.1" (or unquoted after --).'
    ),
]


ExactOption = Annotated[
    bool,
    typer.Option(
        "--exact",
        help="Refuse (exit 2) when no package has exactly --gpus GPUs, instead of taking the smallest "
        "that holds more.",
    ),
]


@dataclass(frozen=True)
class GpuAsk:
    """What the flags ask for: --gpus GPUs (per worker when distributed) of --gpu-type, --exact or not."""

    gpus: int
    gpu_type: str | None
    exact: bool
    per_worker: bool = False


def _sizes(packages: Sequence[ResourcePackageView], gpu_type: str | None) -> list[int]:
    """The GPU counts of the packages of `gpu_type` (any type when None), smallest first."""
    from hai_airflow.scheduling.packages import smallest_package

    # A package holds `gpu_type` exactly when it is the smallest fit among itself alone.
    return sorted({p.gpus for p in packages if p.gpus and smallest_package([p], p.gpus, gpu_type) is p})


def _package_for(packages: Sequence[ResourcePackageView], ask: GpuAsk) -> ResourcePackageView:
    """The smallest package of at least --gpus GPUs of --gpu-type; one holding more is named on
    stderr (stdout stays the result), or refused with --exact."""
    from hai_airflow.scheduling.packages import offered, smallest_package

    if ask.gpus < 1:
        usage_error("--gpus must be 1 or more. For a task without GPUs use `hai submit cpu`")
    package = smallest_package(packages, ask.gpus, ask.gpu_type)
    if package is None:
        usage_error(
            f"no resource package has {ask.gpus} {ask.gpu_type or ''} GPUs".replace("  ", " ")
            + f" (offered: {offered(packages)}). Pick --gpus and --gpu-type from `hai res`"
        )
    if package.gpus == ask.gpus:
        return package
    if ask.exact:
        *most, last = [str(n) for n in _sizes(packages, ask.gpu_type)]
        sizes = f"{', '.join(most)} or {last}" if most else last
        usage_error(
            f"--gpus {ask.gpus} --exact: no {package.gpu_type} resource package has exactly {ask.gpus} "
            f"GPUs. Give --gpus {sizes}, or leave out --exact to get the smallest that fits "
            f"({package.gpus} GPUs)"
        )
    asked = f"{ask.gpus} GPUs per worker" if ask.per_worker else f"{ask.gpus} GPUs"
    note(
        f"package {package.id}: {package.gpus}×{package.gpu_type} "
        f"(asked for {asked}; the smallest package that fits)"
    )
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
    submit_and_report(build_spec(mode, fields, SUBMIT_FLAGS, f"submit {mode}"), submit, connection, out)


@app.command(context_settings=ONE_WORKER_COMMAND)
@with_flags()
def standalone(
    task_name: TaskNameOption,
    code_path: CodePathOption,
    command: CommandArgument,
    gpus: Annotated[int, typer.Option("--gpus", metavar="INTEGER", help="GPUs on one machine.")] = 1,
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
    fields = {"task_name": task_name, "code_path": code_path, "cmd": join_command(command), **job.fields()}
    fields |= {**gpu_job.fields(), "image": image}
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
    cpus: Annotated[float, typer.Option("--cpus", metavar="FLOAT", help="CPU cores.")] = 1,
    memory: Annotated[float, typer.Option("--memory", metavar="GB", help="Memory in GB.")] = 1,
    image: ImageOption = None,
    job: JobFlags = JobFlags(),
    submit: SubmitFlags = SubmitFlags(),
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """A CPU stage, such as preprocessing, that holds no GPU; it may end by submitting the GPU stage."""
    fields = {"task_name": task_name, "code_path": code_path, "cmd": join_command(command), **job.fields()}
    fields |= {"image": image, "cpus": cpus, "memory_gb": memory}
    spec = build_spec("cpu", fields, SUBMIT_FLAGS, "submit cpu")
    submit_and_report(spec, submit, connection, out)
