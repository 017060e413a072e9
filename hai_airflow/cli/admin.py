"""`hai admin check`: the ledger run on the server's store (platform admins)."""

from __future__ import annotations

import typer

from hai_airflow.cli.connection import ServerFlags, connect
from hai_airflow.cli.flags import with_flags
from hai_airflow.cli.output import Column, OutputFlags, emit, help_without_subcommand, note, say

app = typer.Typer(
    help="Platform admins: check the store's history (`hai admin check`).", rich_markup_mode=None
)

PROBLEM_COLUMNS = (
    Column("TASK", lambda p: p.job_id, "right"),
    Column("PROBLEM", lambda p: p.what),
)


@app.callback(invoke_without_command=True)
def admin(ctx: typer.Context) -> None:
    """Platform admins' commands."""
    help_without_subcommand(ctx)


@app.command()
@with_flags()
def check(connection: ServerFlags = ServerFlags(), out: OutputFlags = OutputFlags()) -> int:
    """Check the store's whole history, as after a crash or an outage: every task's state moves legal
    and in time order and leading to its state, no task with two runs at once, no GPU held by two runs
    or beyond its node, no high-priority quota exceeded at any moment. Exit 1 when it finds anything."""
    with connect(connection) as client:
        found = client.check_store()
    if out.is_data:
        emit(found, PROBLEM_COLUMNS, out=out)
    elif found.problems:
        emit(found.problems, PROBLEM_COLUMNS, out=out, name=lambda p: str(p.job_id))
    else:
        read = ((found.jobs, "task"), (found.instances, "instance"), (found.events, "event"))
        counts = ", ".join(_count(n, what) for n, what in read)
        say(f"checked {counts}: no problems")
    if found.problems:
        note(f"hai: {_count(len(found.problems), 'problem')} in {_count(found.jobs, 'task')}")
        return 1
    return 0


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"
