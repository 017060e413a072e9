"""`hai queue`: the scheduler's order of waiting tasks, each weight's terms, and why each waits."""

from __future__ import annotations

from typing import Annotated

import typer

from hai_airflow.cli.connection import JsonOption, ServerOption, connect
from hai_airflow.cli.output import Column, Section, emit, fail
from hai_airflow.cli.task import gpus, priority
from hai_airflow.spec import JobView, QueueEntryView, QueueJobView


def terms(entry: QueueEntryView) -> str:
    """The weight as its sum, to two decimals: `priority class 0 + waiting 15.64`."""
    return " + ".join(f"{t.name} {round(t.value, 2):g}" for t in entry.terms)


def name(job: QueueJobView) -> str:
    """The task's name, or `another user's job` when the caller may not see it."""
    return job.task_name if isinstance(job, JobView) else job.owner


def user(job: QueueJobView, group: bool = False) -> str | None:
    """The owner (and group), shown only for jobs the caller may see."""
    if not isinstance(job, JobView):
        return None
    return f"{job.user} (group {job.group})" if group else job.user


QUEUE_COLUMNS = (
    Column("POS", lambda e: e.position, "right"),
    Column("TASK", lambda e: e.job.id, "right"),
    Column("NAME", lambda e: name(e.job)),
    Column("USER", lambda e: user(e.job)),
    Column("STATE", lambda e: e.job.state),
    Column("PRIORITY", lambda e: priority(e.job)),
    Column("GPUS", lambda e: gpus(e.job)),
    Column("WEIGHT", lambda e: f"{e.weight:.2f}", "right"),
    Column("TERMS", terms),
    Column("WAITS BECAUSE", lambda e: e.reason),
    Column("BEHIND", lambda e: e.waiting_behind, "right"),
)

EXPLAIN_COLUMNS = (
    Column("position", lambda e: e.position),
    Column("task", lambda e: f"{e.job.id} {name(e.job)}"),
    Column("user", lambda e: user(e.job, group=True)),
    Column("state", lambda e: e.job.state),
    Column("priority", lambda e: priority(e.job)),
    Column("gpus", lambda e: gpus(e.job)),
    Column("weight", lambda e: f"{e.weight:.2f} = {terms(e)}" if e.terms else f"{e.weight:.2f}"),
    Column("waits because", lambda e: e.reason),
    Column("waiting behind", lambda e: f"task {e.waiting_behind}" if e.waiting_behind is not None else None),
    Column("preempted by", lambda e: f"task {e.preempted_by}" if e.preempted_by is not None else None),
)

TERM_COLUMNS = (
    Column("TERM", lambda t: t.name),
    Column("VALUE", lambda t: f"{t.value:g}", "right"),
    Column("WHY", lambda t: t.note),
)


def queue(
    explain: Annotated[
        int | None,
        typer.Option(
            "--explain",
            metavar="TASK_ID",
            help="Explain one task's place: its weight term by term, why it waits, who it waits behind.",
        ),
    ] = None,
    server: ServerOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show the scheduler's queue: waiting tasks in the order they will start or resume."""
    with connect(server) as client:
        entries = client.queue()
        if explain is None:
            emit(entries, QUEUE_COLUMNS, as_json=as_json, empty="the queue is empty: nothing waits")
            return
        entry = next((e for e in entries if e.job.id == explain), None)
        if entry is None:
            job = client.job(explain)
            fail(
                f"task {explain} is not waiting in the queue (it is {job.state}). "
                f"See `hai task --task-id {explain}` for its history"
            )
    sections = (Section("Weight terms", entry.terms, TERM_COLUMNS),)
    emit(entry, EXPLAIN_COLUMNS, as_json=as_json, title=f"Task {explain} in the queue", sections=sections)
