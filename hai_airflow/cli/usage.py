"""`hai usage`: who used how many GPU-hours, what preemption cost, and how long tasks waited, over a
window, per user or per group (like Slurm's `sacct`/`sreport`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from hai_airflow import durations
from hai_airflow.cli.connection import ServerFlags, connect
from hai_airflow.cli.flags import choice, completes, with_flags
from hai_airflow.cli.output import Column, OutputFlags, duration, emit
from hai_airflow.vocabulary import JobState

if TYPE_CHECKING:
    from hai_airflow.spec import UsageView

MOMENT_FORMS = "a date (2026-11-01), a UTC time (2026-11-01T12:00), or a time ago (7d, 12h)"


def moment(value: str) -> datetime:
    """A window edge as people give one: a date or time (UTC), or a duration ago."""
    try:
        ago = durations.parse(value)
    except ValueError:
        pass
    else:
        try:
            return datetime.now(UTC) - timedelta(seconds=ago)
        except OverflowError:
            raise typer.BadParameter(f"{value!r} is before the year 1; give a later time") from None
    try:
        given = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not {MOMENT_FORMS}") from None
    return given if given.tzinfo is not None else given.replace(tzinfo=UTC)


def hours(value: float) -> str:
    return f"{value:,.1f}"


def ended(u: UsageView) -> str | None:
    """`3 ok, 1 failed, 1 timeout`: the final states of the jobs that ended in the window."""
    words: dict[str, str] = {
        JobState.SUCCEEDED: "ok",
        JobState.FAILED: "failed",
        JobState.CANCELLED: "cancelled",
        JobState.TIMEOUT: "timeout",
    }
    return ", ".join(f"{n} {words.get(state, state.lower())}" for state, n in u.ended.items()) or None


USAGE_COLUMNS = (
    Column("NAME", lambda u: u.name),
    Column("TASKS", lambda u: u.jobs, "right"),
    Column("GPU-HOURS", lambda u: hours(u.gpu_hours), "right"),
    Column("HIGH", lambda u: hours(u.high_gpu_hours), "right"),
    Column("LOW", lambda u: hours(u.low_gpu_hours), "right"),
    Column("LOST", lambda u: hours(u.lost_gpu_hours), "right"),
    Column(
        "WAIT P50", lambda u: None if u.wait_p50_seconds is None else duration(u.wait_p50_seconds), "right"
    ),
    Column(
        "WAIT P95", lambda u: None if u.wait_p95_seconds is None else duration(u.wait_p95_seconds), "right"
    ),
    Column("ENDED", ended, wide=True),
    Column("STARTED", lambda u: u.waits, "right", wide=True),
)


@with_flags()
def usage(
    since: Annotated[
        datetime | None,
        typer.Option(
            "--since",
            metavar="WHEN",
            parser=moment,
            help=f"Start of the window: {MOMENT_FORMS}. Default: 30 days ago.",
        ),
    ] = None,
    until: Annotated[
        datetime | None,
        typer.Option(
            "--until", metavar="WHEN", parser=moment, help="End of the window (excluded). Default: now."
        ),
    ] = None,
    by: Annotated[
        str,
        typer.Option(
            "--by",
            metavar="user|group",
            parser=choice("user", "group"),
            autocompletion=completes("user", "group"),
            help="One row per user (default) or per group.",
        ),
    ] = "user",
    user: Annotated[
        str | None, typer.Option("--user", metavar="TEXT", help="Only this user (admins of their group).")
    ] = None,
    group: Annotated[
        str | None, typer.Option("--group", metavar="TEXT", help="Only this group (its admins).")
    ] = None,
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """GPU-hours used (high and low priority), GPU-hours lost to preemption (work past the latest
    checkpoint), tasks submitted and ended, and waits from submit to first start (p50, p95), per user
    or group over a window. You see your own; a group's admins its users and totals; platform admins
    everyone's.

    \b
    Examples: hai usage --since 7d
              hai usage --by group --since 2026-11-01 --until 2026-12-01 -o csv > november.csv
    """
    with connect(connection) as client:
        rows = client.usage(since=since, until=until, by=by, user=user, group=group)
    emit(rows, USAGE_COLUMNS, out=out, empty="no use in this window", name=lambda u: u.name)
