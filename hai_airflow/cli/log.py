"""`hai log`: a task's (or one instance's) output, its tail, or followed live (reconnecting) until it ends."""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import typer

from hai_airflow.cli import flagtable
from hai_airflow.cli.columns import standing
from hai_airflow.cli.connection import ServerFlags, connect, reconnect
from hai_airflow.cli.flags import option, with_flags
from hai_airflow.cli.ids import TaskIdArgument, complete_instance_ids, complete_task_ids
from hai_airflow.cli.output import fail, note, stdout_is_terminal, usage_error
from hai_airflow.vocabulary import TERMINAL_STATES

if TYPE_CHECKING:
    from hai_airflow.client import HaiClient

RESUME_MARK = 4096
"""Characters of the output already printed that locate where to resume after a reconnect."""


if TYPE_CHECKING:
    InstanceIdOption = Any
    TaskIdOption = Any
    TailOption = Any
    FollowOption = Any
else:
    InstanceIdOption = option(flagtable.INSTANCE_ID, autocompletion=complete_instance_ids)
    TaskIdOption = option(flagtable.LOG_TASK_ID, autocompletion=complete_task_ids)
    TailOption = option(flagtable.TAIL)
    FollowOption = option(flagtable.FOLLOW)


@with_flags()
def log(
    id_: TaskIdArgument = None,
    instance_id: InstanceIdOption = None,
    task_id: TaskIdOption = None,
    tail: TailOption = 0,
    follow: FollowOption = False,
    connection: ServerFlags = ServerFlags(),
) -> None:
    """Print the training log of a task's latest instance (获取训练日志): `hai log 42 -f`;
    `--instance-id` picks one instance of `hai instance 42`."""
    task = _task_id(id_, task_id, instance_id)
    if tail < 0:
        usage_error("--tail must be 0 (the whole log) or a positive number of lines")
    with connect(connection) as client:
        chosen = _latest_instance(client, task) if task is not None else instance_id
        assert chosen is not None
        if not follow:
            text = client.log(chosen, tail=tail)
            if not text:
                _explain_empty(client, chosen)
            _write(text)
            return
        try:
            follow_with_reconnect(client, chosen, tail)
        except KeyboardInterrupt:
            # Stopping to watch is not an error and leaves the job running.
            raise typer.Exit(130) from None


def _task_id(argument: int | None, flag: int | None, instance_id: int | None) -> int | None:
    """The task named by the positional or --task-id; None when --instance-id names the instance."""
    if argument is not None and flag is not None and argument != flag:
        usage_error(f"two different task ids ({argument} and --task-id {flag}). Give one")
    task = argument if argument is not None else flag
    if (task is None) == (instance_id is None):
        usage_error(
            "give either a task id (`hai log 42`, or --task-id 42) or --instance-id N. "
            "Find a task's instance ids with `hai instance TASK_ID`"
        )
    return task


def _latest_instance(client: HaiClient, task_id: int) -> int:
    """The task's newest instance; a task that has none yet has no log, and the error says why."""
    instances = client.instances(task_id)
    if instances:
        return max(i.id for i in instances)
    job = client.job(task_id)
    started = "never started" if job.state in TERMINAL_STATES else "has not started yet"
    fail(f"no log: {standing(job)}. The task {started}; `hai task {task_id}` shows its events")


def _explain_empty(client: HaiClient, instance_id: int) -> None:
    """An empty log says why on stderr; it is a failure (exit 1) unless the instance ran its command
    and is still running or completed, which then simply printed nothing."""
    run = client.instance(instance_id)
    job = client.job(run.job_id)
    where = f"instance {run.id} of task {job.id} printed nothing: {standing(job)}"
    if run.started_at is not None and run.end_reason in (None, "completed"):
        note(f"({where})")
        return
    never = " The instance never started;" if run.started_at is None else ""
    fail(f"{where}.{never} `hai task {job.id}` shows its events")


def resume_offset(whole: str, printed: str) -> int:
    """Where output continues in the whole log, given the last characters already printed (0 = none)."""
    if not printed:
        return 0
    at = whole.rfind(printed)
    return at + len(printed) if at >= 0 else 0


def _reconnect_status() -> AbstractContextManager[Any]:
    # A status line only for a person at a terminal; piped output gets nothing but the log itself.
    if stdout_is_terminal() and sys.stderr.isatty():
        from rich.console import Console

        return Console(stderr=True).status("lost the server; reconnecting")
    return nullcontext(None)


def follow_with_reconnect(client: HaiClient, instance_id: int, tail: int) -> None:
    """Stream the log until the instance ends; if the server goes away once it has answered, reconnect
    and go on from where the output stopped, without repeating or losing lines. A server that never
    answered fails at once: waiting is for one that restarts, not one that was never there."""
    from hai_airflow.client import HaiConnectionLost, HaiUnreachable

    printed = ""
    skip = 0
    answered = False
    while True:
        try:
            for chunk in client.follow_log(instance_id, tail=tail if not printed else 0):
                if skip:
                    chunk, skip = chunk[skip:], max(skip - len(chunk), 0)
                _write(chunk)
                printed = (printed + chunk)[-RESUME_MARK:]
            return
        except HaiConnectionLost:
            answered = True
        except HaiUnreachable:
            if not answered:
                raise
        skip = _reconnect(client, instance_id, printed)


def _reconnect(client: HaiClient, instance_id: int, printed: str) -> int:
    """Wait for the server to answer again; return how many characters of the whole log were printed."""
    with _reconnect_status() as status:
        return reconnect(client, lambda: resume_offset(client.log(instance_id, tail=0), printed), status)


def _write(text: str) -> None:
    # Raw text, flushed as it comes: log lines may hold anything, including what looks like markup.
    sys.stdout.write(text)
    sys.stdout.flush()
