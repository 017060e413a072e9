"""`hai instance`: a task's runs, each with its placement, exit code and why it ended."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import typer

from hai_airflow.cli.connection import ServerFlags, connect
from hai_airflow.cli.flags import with_flags
from hai_airflow.cli.ids import TaskIdArguments, TaskIdFlags, each, task_ids
from hai_airflow.cli.output import Column, OutputFlags, emit, placement, when

if TYPE_CHECKING:
    from hai_airflow.spec import InstanceView


def end_reason(instance: InstanceView) -> str:
    """`running`, `completed`, `preempted by task 7`, ... in the words `hai task` uses."""
    if instance.end_reason is None:
        return "running" if instance.ended_at is None else "ended"
    if instance.end_reason == "preempted" and instance.preempted_by is not None:
        return f"preempted by task {instance.preempted_by}"
    return instance.end_reason


def start_kind(instance: InstanceView) -> str:
    """`first start`, or the checkpoint a resumed run loaded."""
    if not instance.resume:
        return "first start"
    return f"resume from {instance.checkpoint}" if instance.checkpoint else "resume (no checkpoint yet)"


INSTANCE_COLUMNS = (
    Column("ID", lambda i: i.id, "right"),
    Column("TASK", lambda i: i.job_id, "right", wide=True),
    Column("STARTED", lambda i: when(i.started_at)),
    Column("ENDED", lambda i: when(i.ended_at)),
    Column("PLACEMENT", lambda i: placement(i.placement)),
    Column("EXIT CODE", lambda i: i.exit_code, "right"),
    Column("END REASON", end_reason),
    Column("START", start_kind),
)


@with_flags()
def instance(
    ids: TaskIdArguments = None,
    task_id: TaskIdFlags = None,
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """List the instances (runs) of tasks (列出任务的实例): `hai instance 42`. Every start or resume is a new
    instance."""
    chosen = task_ids(ids, task_id, "instance")
    with connect(connection) as client:
        runs, code = each(chosen, client.instances)
    instances = [i for listed in runs for i in listed]
    # Runs of several tasks name their task in every view, not only in -o wide.
    columns = tuple(replace(c, wide=c.wide and len(chosen) == 1) for c in INSTANCE_COLUMNS)
    named = " ".join(map(str, chosen))
    if runs:
        emit(instances, columns, out=out, empty=f"not started yet; `hai task {named}` says why it waits")
    if code:
        raise typer.Exit(code)
