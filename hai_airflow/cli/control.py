"""Steering a task: `hai promote`, `hai cancel`, and the admins' `hai suspend` / `hai resume`."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from hai_airflow.cli.connection import JsonOption, ServerOption, connect
from hai_airflow.cli.jobspec import MaxScheduleOption
from hai_airflow.cli.output import emit, say, usage_error
from hai_airflow.cli.task import JOB_COLUMNS, TaskIdOption
from hai_airflow.spec import MAX_SCHEDULE_CHOICES, TERMINAL_STATES, JobView

SUSPENDED = frozenset({"SUSPENDED"})
HIGH_CHOICES = "|".join(str(c) for c in MAX_SCHEDULE_CHOICES if c > 0)


def promote(
    task_id: TaskIdOption,
    max_schedule: MaxScheduleOption,
    server: ServerOption = None,
    as_json: JsonOption = False,
) -> None:
    """Make a low-priority task high priority, within your quota (e.g. after a high one finished)."""
    if max_schedule not in MAX_SCHEDULE_CHOICES or max_schedule == 0:
        usage_error(
            f"--max-schedule must be one of {HIGH_CHOICES} to promote (hours; more than 0 = high priority)"
        )
    with connect(server) as client:
        job = client.promote(task_id, max_schedule)
    _report(job, f"promoted task {job.id} to high priority (max-schedule {job.max_schedule}h)", as_json)


def cancel(
    task_id: TaskIdOption,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Cancel without asking (required without a terminal).")
    ] = False,
    server: ServerOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a task: stop its running instance and never start it again."""
    if not yes:
        if not sys.stdin.isatty():
            usage_error(
                f"cancelling task {task_id} needs confirmation and there is no terminal to ask on. Add --yes"
            )
        typer.confirm(f"Cancel task {task_id}? Its running instance is stopped.", abort=True, err=True)
    with connect(server) as client:
        job = client.cancel(task_id)
    _report(job, outcome_line("cancelled", "cancelling", job, TERMINAL_STATES), as_json)


def suspend(task_id: TaskIdOption, server: ServerOption = None, as_json: JsonOption = False) -> None:
    """Suspend a running task now (admins); it waits to be resumed and restarts from its checkpoint."""
    with connect(server) as client:
        job = client.suspend(task_id)
    _report(job, outcome_line("suspended", "suspending", job, SUSPENDED), as_json)


def resume(task_id: TaskIdOption, server: ServerOption = None, as_json: JsonOption = False) -> None:
    """Queue a suspended task to run again (admins); it starts when resources are free."""
    with connect(server) as client:
        job = client.resume(task_id)
    _report(job, f"resumed task {job.id} (now {job.state})", as_json)


def outcome_line(done: str, doing: str, job: JobView, done_states: frozenset[str]) -> str:
    """`cancelled task 7 (now CANCELLED)` once done, `cancelling task 7 (now RUNNING)` while on its way."""
    verb = done if job.state in done_states else doing
    return f"{verb} task {job.id} (now {job.state})"


def _report(job: JobView, line: str, as_json: bool) -> None:
    if as_json:
        emit(job, JOB_COLUMNS, as_json=True)
    else:
        say(line)
