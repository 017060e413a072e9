"""`hai log`: an instance's output, the tail of it, or followed live until the instance ends."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from hai_airflow.cli.connection import ServerOption, connect
from hai_airflow.cli.output import fail, usage_error


def log(
    instance_id: Annotated[
        int | None,
        typer.Option(
            "--instance-id",
            "--instance_id",
            metavar="INTEGER",
            help="Instance id, from `hai instance`. 运行实例ID，从hai instance获取",
        ),
    ] = None,
    task_id: Annotated[
        int | None,
        typer.Option(
            "--task-id",
            "--task_id",
            metavar="INTEGER",
            help="Instead of --instance-id: the latest instance of this task.",
        ),
    ] = None,
    tail: Annotated[
        int,
        typer.Option(
            "--tail",
            metavar="INTEGER",
            help="Only the last K lines; 0 = the whole log. 仅获取尾部多少行，为0时表示获取全部",
        ),
    ] = 0,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new output until the instance ends.")
    ] = False,
    server: ServerOption = None,
) -> None:
    """Print the training log of an instance (获取训练日志)."""
    if (instance_id is None) == (task_id is None):
        usage_error(
            "give exactly one of --instance-id and --task-id. Find ids with `hai instance --task-id N`"
        )
    if tail < 0:
        usage_error("--tail must be 0 (the whole log) or a positive number of lines")
    with connect(server) as client:
        if instance_id is None:
            assert task_id is not None
            instances = client.instances(task_id)
            if not instances:
                fail(f"task {task_id} has no instance yet. `hai task --task-id {task_id}` says why it waits")
            instance_id = max(i.id for i in instances)
        if not follow:
            _write(client.log(instance_id, tail=tail))
            return
        try:
            for chunk in client.follow_log(instance_id, tail=tail):
                _write(chunk)
        except KeyboardInterrupt:
            # Stopping to watch is not an error and leaves the job running.
            raise typer.Exit(130) from None


def _write(text: str) -> None:
    # Raw text, flushed as it comes: log lines may hold anything, including what looks like markup.
    sys.stdout.write(text)
    sys.stdout.flush()
