"""`hai task`: the caller's tasks (jobs) and their state, or tasks in detail with their events."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hai_airflow.cli import columns, flagtable
from hai_airflow.cli.columns import EVENT_COLUMNS, forecast, gpus, job_columns, job_detail_columns, priority
from hai_airflow.cli.connection import ServerFlags, connect
from hai_airflow.cli.flags import option, with_flags
from hai_airflow.cli.ids import StateOption, TaskIdArguments, TaskIdFlags, each
from hai_airflow.cli.output import OutputFlags, Section, emit
from hai_airflow.vocabulary import TERMINAL_STATES

if TYPE_CHECKING:
    from hai_airflow.client import HaiClient
    from hai_airflow.spec import JobDetailView, JobView

__all__ = ["forecast", "gpus", "priority", "processes"]

WatchOption = Annotated[
    bool,
    typer.Option(
        "--watch",
        "-w",
        help="Keep the view on screen and redraw it whenever a task shown changes state (Ctrl-C stops).",
    ),
]


def default_processes(mode: str) -> str | None:
    """The spec's `processes` default of a mode (None for a CPU job): what a job stored before the
    field existed runs with, as the backends read it."""
    from hai_airflow.cli.jobspec import spec_models

    field = spec_models()[mode].model_fields.get("processes")
    return None if field is None else str(field.default)


def processes(job: JobView) -> str | None:
    """`per-gpu (16 processes)`: how the command is started and how many copies run; None for CPU jobs."""
    return columns.processes(job, default_processes(job.mode))


JOB_COLUMNS = job_columns(datetime.now(UTC), with_user=False)
"""The columns of one job (for commands that print a job they acted on)."""
JOB_DETAIL_COLUMNS = job_detail_columns(default_processes)

if TYPE_CHECKING:
    AllOption = Any
    UserOption = Any
    LimitOption = Any
    SelectorOption = Any
    ArrayOption = Any
else:
    AllOption = option(flagtable.ALL)
    UserOption = option(flagtable.USER)
    LimitOption = option(flagtable.LIMIT)
    SelectorOption = option(flagtable.SELECTOR)
    ArrayOption = option(flagtable.ARRAY_FILTER)


@with_flags()
def task(
    ids: TaskIdArguments = None,
    task_id: TaskIdFlags = None,
    all_: AllOption = False,
    state_filter: StateOption = None,
    user: UserOption = None,
    limit: LimitOption = None,
    selector: SelectorOption = None,
    array: ArrayOption = None,
    watch_: WatchOption = False,
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """List your training tasks and their status (列出训练任务列表和状态); `hai task 42`: one in detail.

    `hai task 42 -o yaml` prints task 42's spec as a job file, which `hai create -f` takes again;
    -o json prints the whole record.
    """
    chosen = list(dict.fromkeys([*(ids or ()), *(task_id or ())]))

    def draw(client: HaiClient) -> dict[int, str] | None:
        if chosen:
            shown, code = each(chosen, client.job)
            show_tasks(shown, out, several=len(chosen) > 1)
            if code:
                raise typer.Exit(code)
            return {j.id: j.state for j in shown if j.state not in TERMINAL_STATES} or None
        jobs = client.jobs(
            user=user, state=state_filter, all=all_, limit=limit, selector=selector, array=array
        )
        columns = job_columns(datetime.now(UTC), with_user=all_ or user is not None)
        emit(jobs, columns, out=out, empty="no tasks; submit one with `hai create` or `hai submit`")
        return {j.id: j.state for j in jobs if j.state not in TERMINAL_STATES}

    if watch_:
        from hai_airflow.cli.watch import watch

        watch(connection, "hai task", draw)
    with connect(connection) as client:
        draw(client)


def show_tasks(jobs: Sequence[JobDetailView], out: OutputFlags, several: bool) -> None:
    """Tasks as records, each followed by its events; as JSON, one object (or a list for several ids);
    as YAML, each one's spec as a job file for `hai create -f` (several as `---`-separated documents)."""
    if out.format == "yaml":
        from hai_airflow.jobfile import job_file

        if jobs:
            typer.echo("\n---\n".join(job_file(job.spec) for job in jobs))
        return
    if out.is_data or out.format == "name":
        if jobs:
            emit(list(jobs) if several else jobs[0], JOB_DETAIL_COLUMNS, out=out)
        return
    for job in jobs:
        events = Section("Events", job.events, EVENT_COLUMNS)
        emit(job, JOB_DETAIL_COLUMNS, out=out, title=f"Task {job.id}", sections=(events,))
