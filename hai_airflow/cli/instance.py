"""`hai instance`: a task's runs, each with its placement, exit code and why it ended."""

from __future__ import annotations

from dataclasses import replace

import typer

from hai_airflow.cli.columns import INSTANCE_COLUMNS, end_reason, start_kind
from hai_airflow.cli.connection import ServerFlags, connect
from hai_airflow.cli.flags import with_flags
from hai_airflow.cli.ids import TaskIdArguments, TaskIdFlags, each, task_ids
from hai_airflow.cli.output import OutputFlags, emit

__all__ = ["INSTANCE_COLUMNS", "end_reason", "start_kind"]


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
