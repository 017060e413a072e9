"""`hai instance`: a task's runs, each with its placement, exit code and why it ended."""

from __future__ import annotations

from hai_airflow.cli.connection import JsonOption, ServerOption, connect
from hai_airflow.cli.output import Column, emit, placement, when
from hai_airflow.cli.task import TaskIdOption
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
    Column("STARTED", lambda i: when(i.started_at)),
    Column("ENDED", lambda i: when(i.ended_at)),
    Column("PLACEMENT", lambda i: placement(i.placement)),
    Column("EXIT CODE", lambda i: i.exit_code, "right"),
    Column("END REASON", end_reason),
    Column("START", start_kind),
)


def instance(task_id: TaskIdOption, server: ServerOption = None, as_json: JsonOption = False) -> None:
    """List the instances (runs) of a task (列出任务的实例). Every start or resume is a new instance."""
    with connect(server) as client:
        instances = client.instances(task_id)
    emit(
        instances,
        INSTANCE_COLUMNS,
        as_json=as_json,
        empty=f"task {task_id} has not started yet; `hai task --task-id {task_id}` says why it waits",
    )
