"""`hai task`: the caller's tasks (jobs) and their state, or one task in detail with its events."""

from __future__ import annotations

from typing import Annotated

import typer

from hai_airflow.cli.connection import JsonOption, ServerOption, connect
from hai_airflow.cli.output import Column, Section, duration, emit, placement, when
from hai_airflow.spec import EventView, JobDetailView, JobState, JobView

TaskIdOption = Annotated[
    int,
    typer.Option("--task-id", "--task_id", metavar="INTEGER", help="Task id, from `hai task`."),
]


def priority(job: JobView) -> str:
    """`high (24h)` or `low`: the class and the expected queueing time that chose it."""
    return f"high ({job.max_schedule}h)" if job.priority == "high" else "low"


def gpus(job: JobView) -> str:
    """`8 V100`, `16 A100 (2x8)` for distributed jobs, `0` for CPU jobs."""
    if not job.gpus:
        return "0"
    text = f"{job.gpus} {job.gpu_type}" if job.gpu_type else str(job.gpus)
    if job.mode == "distributed":
        text += f" ({job.workers}x{job.gpus // max(job.workers, 1)})"
    return text


JOB_COLUMNS = (
    Column("ID", lambda j: j.id, "right"),
    Column("NAME", lambda j: j.task_name),
    Column("MODE", lambda j: j.mode),
    Column("PRIORITY", priority),
    Column("STATE", lambda j: j.state),
    Column("GPUS", gpus),
    Column("RUNTIME", lambda j: duration(j.runtime_seconds), "right"),
    Column("PREEMPTIONS", lambda j: j.preemptions, "right"),
    Column("LATEST CHECKPOINT", lambda j: j.latest_checkpoint),
)

JOB_DETAIL_COLUMNS = (
    Column("id", lambda j: j.id),
    Column("name", lambda j: j.task_name),
    Column("user", lambda j: f"{j.user} (group {j.group})"),
    Column("mode", lambda j: j.mode),
    Column("state", lambda j: j.state),
    Column("reason", lambda j: j.reason),
    Column("priority", priority),
    Column("gpus", gpus),
    Column("placement", lambda j: placement(j.placement)),
    Column("image", lambda j: j.spec.get("image")),
    Column("code path", lambda j: j.spec.get("code_path")),
    Column("command", lambda j: j.spec.get("cmd")),
    Column("submitted", lambda j: when(j.submitted_at)),
    Column("started", lambda j: when(j.started_at)),
    Column("ended", lambda j: when(j.ended_at)),
    Column("runtime", lambda j: duration(j.runtime_seconds)),
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


def task(
    task_id: Annotated[
        int | None,
        typer.Option(
            "--task-id",
            "--task_id",
            metavar="INTEGER",
            help="Show this one task in detail: placement, why it waits, and its events.",
        ),
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="Every task of your group (all groups for platform admins).")
    ] = False,
    state_filter: Annotated[
        JobState | None,
        typer.Option(
            "--state",
            metavar="STATE",
            case_sensitive=False,
            help="Only tasks in this state, e.g. RUNNING, PENDING, SUSPENDED.",
        ),
    ] = None,
    user: Annotated[
        str | None, typer.Option("--user", metavar="TEXT", help="Only this user's tasks (admins).")
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", metavar="INTEGER", help="At most this many tasks, newest first.")
    ] = None,
    server: ServerOption = None,
    as_json: JsonOption = False,
) -> None:
    """List your training tasks and their status (列出训练任务列表和状态)."""
    with connect(server) as client:
        if task_id is not None:
            show_task(client.job(task_id), as_json)
            return
        jobs = client.jobs(user=user, state=state_filter, all=all_, limit=limit)
    emit(jobs, JOB_COLUMNS, as_json=as_json, empty="no tasks; submit one with `hai create` or `hai submit`")


def show_task(job: JobDetailView, as_json: bool) -> None:
    """One task as a record, followed by its events."""
    events = Section("Events", job.events, EVENT_COLUMNS)
    emit(job, JOB_DETAIL_COLUMNS, as_json=as_json, title=f"Task {job.id}", sections=(events,))
