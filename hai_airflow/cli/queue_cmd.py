"""`hai queue`: the scheduler's order of waiting tasks, each weight's terms, and why each waits."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import typer

from hai_airflow.cli.connection import ServerFlags, connect
from hai_airflow.cli.flags import with_flags
from hai_airflow.cli.ids import complete_task_ids
from hai_airflow.cli.output import Column, OutputFlags, Section, emit, fail, state_style
from hai_airflow.cli.task import WatchOption, gpus, priority

if TYPE_CHECKING:
    from hai_airflow.client import HaiClient
    from hai_airflow.scheduling.eta import StartEstimate
    from hai_airflow.spec import QueueEntryView, QueueJobView


def terms(entry: QueueEntryView) -> str:
    """The weight as its sum, to two decimals: `priority class 0 + waiting 15.64`."""
    return " + ".join(f"{t.name} {round(t.value, 2):g}" for t in entry.terms)


def name(job: QueueJobView) -> str:
    """The task's name, or `another user's job` when the caller may not see it."""
    from hai_airflow.spec import JobView

    return job.task_name if isinstance(job, JobView) else job.owner


def user(job: QueueJobView, group: bool = False) -> str | None:
    """The owner (and group), shown only for jobs the caller may see."""
    from hai_airflow.spec import JobView

    if not isinstance(job, JobView):
        return None
    return f"{job.user} (group {job.group})" if group else job.user


def eta(estimate: StartEstimate | None) -> str | None:
    """The shared start estimate in a cell: `now`, `~17:05` (a victim's grace period ends), `by 17:05`
    (the max_schedule promise), `~17:05 (history)` (forecast, with what it rests on), or nothing when
    unknown; local time, with the date when it is not today."""
    if estimate is None or estimate.kind == "unknown":
        return None
    if estimate.kind == "now" or estimate.at is None:
        return "now"
    local = estimate.at.astimezone()
    moment = local.strftime("%H:%M" if local.date() == datetime.now().astimezone().date() else "%m-%d %H:%M")
    if estimate.kind == "forecast":
        return f"~{moment} ({estimate.source})" if estimate.source else f"~{moment}"
    return f"~{moment}" if estimate.kind == "grace" else f"by {moment}"


def estimates(client: HaiClient, entries: list[QueueEntryView]) -> dict[int, StartEstimate]:
    """Each entry's start estimate, from the one function the dashboard uses; a blocker the caller
    may not see counts as unknown."""
    from hai_airflow.client import HaiError
    from hai_airflow.scheduling.eta import start_estimate

    blockers = {}
    for blocker_id in sorted({e.waiting_behind for e in entries if e.waiting_behind is not None}):
        try:
            blockers[blocker_id] = client.job(blocker_id)
        except HaiError as error:
            if error.status not in (403, 404):
                raise
    return {
        e.job.id: start_estimate(e, blockers.get(e.waiting_behind) if e.waiting_behind is not None else None)
        for e in entries
    }


def queue_columns(etas: Mapping[int, StartEstimate]) -> tuple[Column, ...]:
    """The queue's columns with each task's ETA."""
    return (*QUEUE_COLUMNS[:8], Column("ETA", lambda e: eta(etas.get(e.job.id))), *QUEUE_COLUMNS[8:])


QUEUE_COLUMNS = (
    Column("POS", lambda e: e.position, "right"),
    Column("TASK", lambda e: e.job.id, "right"),
    Column("NAME", lambda e: name(e.job)),
    Column("USER", lambda e: user(e.job)),
    Column("STATE", lambda e: e.job.state, style=lambda e: state_style(e.job.state)),
    Column("PRIORITY", lambda e: priority(e.job)),
    Column("GPUS", lambda e: gpus(e.job)),
    Column("WEIGHT", lambda e: f"{e.weight:.2f}", "right"),
    Column("TERMS", terms, wide=True),
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


@with_flags()
def queue(
    explain: Annotated[
        int | None,
        typer.Option(
            "--explain",
            metavar="TASK_ID",
            help="Explain one task's place: its weight term by term, why it waits, who it waits behind.",
            autocompletion=complete_task_ids,
        ),
    ] = None,
    watch_: WatchOption = False,
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """Show the scheduler's queue: waiting tasks in the order they will start or resume, with the ETA
    the dashboard shows."""
    from hai_airflow.spec import JobView

    def draw(client: HaiClient) -> dict[int, str]:
        entries = client.queue()
        if explain is None:
            columns = queue_columns(estimates(client, entries)) if not out.is_data else QUEUE_COLUMNS
            emit(
                entries, columns, out=out, empty="the queue is empty: nothing waits", name=lambda e: e.job.id
            )
            return {e.job.id: e.job.state for e in entries if isinstance(e.job, JobView)}
        entry = next((e for e in entries if e.job.id == explain), None)
        if entry is None:
            job = client.job(explain)
            fail(
                f"task {explain} is not waiting in the queue (it is {job.state}). "
                f"See `hai task {explain}` for its history"
            )
        sections = (Section("Weight terms", entry.terms, TERM_COLUMNS),)
        title = f"Task {explain} in the queue"
        estimate = estimates(client, [entry])[entry.job.id]
        starts = Column("expected start", lambda e: f"{eta(estimate) or 'unknown'} ({estimate.note})")
        columns = (*EXPLAIN_COLUMNS[:7], starts, *EXPLAIN_COLUMNS[7:])
        emit(entry, columns, out=out, title=title, sections=sections, name=lambda e: e.job.id)
        return {entry.job.id: entry.job.state}

    if watch_:
        from hai_airflow.cli.watch import watch

        watch(connection, "hai queue", draw)
    with connect(connection) as client:
        draw(client)
