"""Steering tasks: `hai promote`, `hai cancel`, `hai requeue`, `hai hold`/`hai release`, the admins'
`hai suspend`/`hai resume`; one id or several."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hai_airflow.cli import flagtable
from hai_airflow.cli.columns import cancel_line, outcome_line
from hai_airflow.cli.connection import ServerFlags, connect
from hai_airflow.cli.flags import option, with_flags
from hai_airflow.cli.ids import TaskIdArguments, TaskIdFlags, each, task_ids
from hai_airflow.cli.jobspec import MaxScheduleOption
from hai_airflow.cli.output import OutputFlags, emit, say, usage_error
from hai_airflow.cli.task import JOB_COLUMNS
from hai_airflow.vocabulary import MAX_SCHEDULE_CHOICES, JobState

if TYPE_CHECKING:
    from hai_airflow.client import HaiClient
    from hai_airflow.spec import JobView

SUSPENDED = frozenset({JobState.SUSPENDED})
HIGH_CHOICES = "|".join(str(c) for c in MAX_SCHEDULE_CHOICES if c > 0)


@with_flags()
def promote(
    ids: TaskIdArguments = None,
    task_id: TaskIdFlags = None,
    max_schedule: MaxScheduleOption = 0,
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """Make low-priority tasks high priority, within your quota (e.g. after a high one finished)."""
    from hai_airflow.spec import is_high

    chosen = task_ids(ids, task_id, "promote")
    if max_schedule not in MAX_SCHEDULE_CHOICES or not is_high(max_schedule):
        usage_error(
            f"--max-schedule must be one of {HIGH_CHOICES} to promote (hours; more than 0 = high priority)"
        )

    def line(job: JobView) -> str:
        return f"promoted task {job.id} to high priority (max-schedule {job.max_schedule}h)"

    act_on_each(connection, chosen, lambda c, i: c.promote(i, max_schedule), line, out)


def asks_first(tasks: int, yes: bool, terminal: bool) -> bool:
    """Whether `hai cancel` asks before it acts: only a person at a terminal cancelling several tasks
    without --yes. One task, or a script (no terminal), is cancelled at once, as scancel and kubectl
    delete do."""
    return not yes and terminal and tasks > 1


if TYPE_CHECKING:
    YesOption = Any
else:
    YesOption = option(flagtable.YES)


@with_flags()
def cancel(
    ids: TaskIdArguments = None,
    task_id: TaskIdFlags = None,
    yes: YesOption = False,
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """Cancel tasks (`hai cancel 42 43`): stop their running instances and never start them again.
    An array's id (its first task's) cancels every task of the array, as scancel does."""
    chosen = task_ids(ids, task_id, "cancel")
    named = ", ".join(map(str, chosen))
    noun = "task" if len(chosen) == 1 else "tasks"
    if asks_first(len(chosen), yes, sys.stdin.isatty()):
        typer.confirm(f"Cancel {noun} {named}? Running instances are stopped.", abort=True, err=True)

    act_on_each(connection, chosen, lambda c, i: c.cancel(i), cancel_line, out)


@with_flags()
def suspend(
    ids: TaskIdArguments = None,
    task_id: TaskIdFlags = None,
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """Suspend running tasks now (admins); each waits to be resumed and restarts from its checkpoint."""
    chosen = task_ids(ids, task_id, "suspend")

    def line(job: JobView) -> str:
        return outcome_line("suspended", "suspending", job, SUSPENDED)

    act_on_each(connection, chosen, lambda c, i: c.suspend(i), line, out)


@with_flags()
def resume(
    ids: TaskIdArguments = None,
    task_id: TaskIdFlags = None,
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """Queue suspended tasks to run again (admins); each starts when resources are free."""
    chosen = task_ids(ids, task_id, "resume")
    act_on_each(
        connection,
        chosen,
        lambda c, i: c.resume(i),
        lambda job: f"resumed task {job.id} (now {job.state})",
        out,
    )


@with_flags()
def requeue(
    ids: TaskIdArguments = None,
    task_id: TaskIdFlags = None,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="Start from scratch, in an empty model dir, instead of from the task's latest "
            "checkpoint and the files of its model dir.",
        ),
    ] = False,
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """Run failed, cancelled or timed-out tasks again: each as a new task with the same spec, owner and
    quota checks, resuming from its latest checkpoint, its model dir's files carried over into the new
    task's own (`hai requeue 12`, `hai requeue 12 --fresh`)."""
    chosen = task_ids(ids, task_id, "requeue")

    def line(job: JobView) -> str:
        how = f"from its checkpoint {job.latest_checkpoint}" if job.latest_checkpoint else "from the start"
        return f"requeued task {job.requeued_from} as task {job.id} ({how})"

    act_on_each(connection, chosen, lambda c, i: c.requeue(i, fresh), line, out)


@with_flags()
def hold(
    ids: TaskIdArguments = None,
    task_id: TaskIdFlags = None,
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """Keep waiting tasks (pending, or suspended and waiting to resume) from starting until `hai release`."""
    chosen = task_ids(ids, task_id, "hold")
    act_on_each(
        connection, chosen, lambda c, i: c.hold(i), lambda job: f"held task {job.id} (now {job.state})", out
    )


@with_flags()
def release(
    ids: TaskIdArguments = None,
    task_id: TaskIdFlags = None,
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """Let held tasks be scheduled again: your own holds (group admins release any hold)."""
    chosen = task_ids(ids, task_id, "release")
    act_on_each(
        connection,
        chosen,
        lambda c, i: c.release(i),
        lambda job: f"released task {job.id} (now {job.state})",
        out,
    )


def act_on_each(
    connection: ServerFlags,
    ids: Sequence[int],
    act: Callable[[HaiClient, int], JobView],
    line: Callable[[JobView], str],
    out: OutputFlags,
) -> None:
    """Act on every id; one result line each as it is done (or the jobs as data at the end); exit
    non-zero if any was refused."""
    as_lines = out.format in ("table", "wide")

    def act_and_say(job_id: int) -> JobView:
        job = act(client, job_id)
        if as_lines:
            say(line(job))
        return job

    with connect(connection) as client:
        jobs, code = each(ids, act_and_say)
    if not as_lines and jobs:
        emit(jobs[0] if len(ids) == 1 else jobs, JOB_COLUMNS, out=out)
    if code:
        raise typer.Exit(code)
