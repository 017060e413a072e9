"""`hai exec N -- COMMAND`: run a command beside a running task's worker, as kubectl exec does."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from hai_airflow.cli.connection import ServerFlags, connect
from hai_airflow.cli.flags import with_flags
from hai_airflow.cli.ids import complete_task_ids
from hai_airflow.cli.jobspec import duration_seconds
from hai_airflow.cli.output import note

NO_EXIT_CODE = 1
"""The exit code when the server could not say how the command ended."""


@with_flags()
def exec_(
    task_id: Annotated[
        int,
        typer.Argument(metavar="TASK_ID", help="A running task of yours.", autocompletion=complete_task_ids),
    ],
    command: Annotated[
        list[str],
        typer.Argument(metavar="-- COMMAND...", help="The program and its arguments, after `--` (no shell)."),
    ],
    worker: Annotated[
        int, typer.Option("--worker", "-w", min=0, help="The worker (rank) to run it beside.")
    ] = 0,
    timeout: Annotated[
        int | None,
        typer.Option(
            "--timeout",
            metavar="DURATION",
            parser=duration_seconds,
            help="Kill it after this long (30s, 5m); default: when it ends or you press Ctrl-C.",
            show_default=False,
        ),
    ] = None,
    connection: ServerFlags = ServerFlags(),
) -> int:
    """Run a command beside a running task's worker: as the task's account, with its environment
    (HAI_*, CUDA_VISIBLE_DEVICES, the rank variables) and in its directory. Its output is printed as it
    comes; hai exits with its exit code. No stdin and no terminal: `hai exec 12 -- nvidia-smi`,
    `hai exec 12 -w 1 -- sh -c 'ls $HAI_MODEL_DIR'`. Only the task's owner may."""
    code: int | None = NO_EXIT_CODE
    with connect(connection) as client:
        out = sys.stdout
        for item in client.exec(task_id, command, worker, timeout):
            if "output" in item:
                out.write(item["output"])
                out.flush()
            elif "exit_code" in item:
                code = item["exit_code"]
                if item.get("reason"):
                    note(f"hai: {item['reason']}")
    return NO_EXIT_CODE if code is None else code
