"""`hai task`: the caller's tasks (jobs) and their state, or tasks in detail with their events."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer

from hai_airflow import durations
from hai_airflow.cli.connection import ServerFlags, connect
from hai_airflow.cli.flags import with_flags
from hai_airflow.cli.ids import StateOption, TaskIdArguments, TaskIdFlags, each
from hai_airflow.cli.output import (
    Column,
    OutputFlags,
    Section,
    age,
    duration,
    emit,
    placement,
    state_style,
    when,
)
from hai_airflow.vocabulary import TERMINAL_STATES

if TYPE_CHECKING:
    from hai_airflow.client import HaiClient
    from hai_airflow.spec import EventView, JobDetailView, JobShapeView, JobView

WatchOption = Annotated[
    bool,
    typer.Option(
        "--watch",
        "-w",
        help="Keep the view on screen and redraw it whenever a task shown changes state (Ctrl-C stops).",
    ),
]


def priority(job: JobView) -> str:
    """`high (24h)` or `low`: the class and the expected queueing time that chose it."""
    return f"high ({job.max_schedule}h)" if job.priority == "high" else "low"


def gpus(job: JobShapeView) -> str:
    """`8 V100`, `16 A100 (2x8)` for distributed jobs, `0` for CPU jobs; a resizable job adds its
    least workers, `32 A100 (4x8, min 2)`, and a shrunk one what it runs at of what it asked for,
    `16/32 A100 (2/4 workers x 8, min 2)`."""
    if not job.gpus:
        return "0"
    per_worker = job.gpus // max(job.workers, 1)
    total = f"{job.size * per_worker}/{job.gpus}" if job.resized else str(job.gpus)
    text = f"{total} {job.gpu_type}" if job.gpu_type else total
    if job.mode != "distributed":
        return text
    shape = (
        f"{job.size}/{job.workers} workers x {per_worker}" if job.resized else f"{job.workers}x{per_worker}"
    )
    least = f", min {job.min_workers}" if job.min_workers is not None else ""
    return f"{text} ({shape}{least})"


def processes(job: JobView) -> str | None:
    """`per-gpu (16 processes)`: how the command is started and how many copies run; None for CPU jobs."""
    from hai_airflow.cli.jobspec import spec_models

    model = spec_models()[job.mode]
    if "processes" not in model.model_fields:
        return None
    # A job stored before the field existed runs with the mode's default, as the backends read it.
    chosen = job.spec.get("processes") or model.model_fields["processes"].default
    size = max(job.size, 1)
    count = size * (job.gpus // max(job.workers, 1)) if chosen == "per-gpu" else size
    return f"{chosen} ({count} process{'es' if count != 1 else ''})"


def time_limit(job: JobView) -> str | None:
    """`4h (1h30m left)` while it may run, `4h` once ended; None without a limit."""
    limit = job.spec.get("time_limit_seconds")
    if not limit:
        return None
    if job.state in TERMINAL_STATES:
        return durations.text(limit)
    return f"{durations.text(limit)} ({durations.text(max(0, limit - round(job.runtime_seconds)))} left)"


def forecast(job: JobDetailView) -> str | None:
    """The latest forecast in words: `starts ~<time> (history)`, a running job's expected end and
    suspension, or how far the forecast looked without reaching the job."""
    f = job.forecast
    if f is None:
        return None
    source = f" ({f.source})" if f.source else ""
    if f.start_at is not None:
        return f"starts ~{when(f.start_at)}{source}"
    if f.end_at is not None:
        suspended = f", may be suspended ~{when(f.suspension_at)}" if f.suspension_at is not None else ""
        return f"ends ~{when(f.end_at)}{source}{suspended}"
    return f"not before {when(f.horizon)}" if f.horizon is not None else None


def job_columns(now: datetime, with_user: bool) -> tuple[Column, ...]:
    """`hai task`'s columns; USER where the listing can span users, and always with -o wide."""
    return (
        Column("ID", lambda j: j.id, "right"),
        Column("NAME", lambda j: j.task_name),
        Column("USER", lambda j: j.user, wide=not with_user),
        Column("GROUP", lambda j: j.group, wide=True),
        Column("MODE", lambda j: j.mode),
        Column("PRIORITY", priority),
        Column("STATE", lambda j: j.state, style=lambda j: state_style(j.state)),
        Column("GPUS", gpus),
        Column("AGE", lambda j: age(j.submitted_at, now), "right"),
        Column("SUBMITTED", lambda j: when(j.submitted_at), wide=True),
        Column("ENDED", lambda j: when(j.ended_at), wide=True),
        Column("RUNTIME", lambda j: duration(j.runtime_seconds), "right"),
        Column("PREEMPTIONS", lambda j: j.preemptions, "right"),
        Column("PLACEMENT", lambda j: placement(j.placement), wide=True),
        Column("LATEST CHECKPOINT", lambda j: j.latest_checkpoint),
        Column("REASON", lambda j: j.reason, wide=True),
    )


JOB_COLUMNS = job_columns(datetime.now(UTC), with_user=False)
"""The columns of one job (for commands that print a job they acted on)."""

JOB_DETAIL_COLUMNS = (
    Column("id", lambda j: j.id),
    Column("name", lambda j: j.task_name),
    Column("user", lambda j: f"{j.user} (group {j.group})"),
    Column("mode", lambda j: j.mode),
    Column("state", lambda j: j.state, style=lambda j: state_style(j.state)),
    Column("reason", lambda j: j.reason),
    Column("priority", priority),
    Column("gpus", gpus),
    Column("processes", processes),
    Column("placement", lambda j: placement(j.placement)),
    Column("image", lambda j: j.spec.get("image")),
    Column("code path", lambda j: j.spec.get("code_path")),
    Column("command", lambda j: j.spec.get("cmd")),
    Column("submitted", lambda j: when(j.submitted_at)),
    Column("submitted via", lambda j: j.submitted_via),
    Column("requeued from", lambda j: j.requeued_from and f"task {j.requeued_from}"),
    Column("started", lambda j: when(j.started_at)),
    Column("ended", lambda j: when(j.ended_at)),
    Column("runtime", lambda j: duration(j.runtime_seconds)),
    Column("time limit", time_limit),
    Column("forecast", forecast),
    Column("array", lambda j: j.array_id and f"task {j.array_index} of array {j.array_id}"),
    Column("labels", lambda j: ", ".join(f"{k}={v}" for k, v in sorted(j.spec.get("labels", {}).items()))),
    Column("instances", lambda j: j.instances),
    Column("preemptions", lambda j: j.preemptions),
    Column("latest checkpoint", lambda j: j.latest_checkpoint),
    Column("checkpoint saved", lambda j: when(j.latest_checkpoint_at)),
)

EVENT_COLUMNS = (
    Column("AT", lambda e: when(e.at)),
    Column("EVENT", lambda e: e.kind),
    Column("STATE", lambda e: transition(e)),
    Column("BY", lambda e: e.actor),
    Column("REASON", lambda e: e.reason),
)


def transition(event: EventView) -> str | None:
    """`PENDING -> STARTING`, or just the new state."""
    if event.from_state and event.to_state:
        return f"{event.from_state} -> {event.to_state}"
    return event.to_state


@with_flags()
def task(
    ids: TaskIdArguments = None,
    task_id: TaskIdFlags = None,
    all_: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Every task you may see: yours, every task of the groups you administer, and for a "
            "platform admin every task (others' waiting tasks are in `hai queue`).",
        ),
    ] = False,
    state_filter: StateOption = None,
    user: Annotated[
        str | None, typer.Option("--user", metavar="TEXT", help="Only this user's tasks (admins).")
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", metavar="INTEGER", help="At most this many tasks, newest first.")
    ] = None,
    selector: Annotated[
        str | None,
        typer.Option(
            "--selector",
            "-l",
            metavar="SELECTOR",
            help="Only tasks whose labels match: team=vision, stage!=eval, gpu (has it), !draft; "
            "comma-separated, all must hold.",
        ),
    ] = None,
    array: Annotated[
        int | None,
        typer.Option("--array", metavar="ID", help="Only the tasks of this array (its first task's id)."),
    ] = None,
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
