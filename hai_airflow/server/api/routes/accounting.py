"""`GET /usage`: accounting over a window, per user or per group (`server.accounting` does the sums).

Each caller sees what they may list: their own use; a group admin, the users and totals of the
groups they administer; a platform admin, everyone's."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from sqlalchemy import Select, func, or_, select
from sqlalchemy.orm import Session

from hai_airflow.server.api.routes.depends import CallerDep, CtxDep, listable
from hai_airflow.server.errors import ApiError
from hai_airflow.server.jobs.accounting import (
    DAY,
    HOUR,
    Account,
    JobRecord,
    Run,
    daily_gpu_hours,
    days,
    report,
    waiting_at,
)
from hai_airflow.server.jobs.auth import Caller
from hai_airflow.server.store import clock
from hai_airflow.server.store.tables import InstanceRow, JobRow, NodeRow, UserRow
from hai_airflow.spec import PrincipalName, UsageHistoryView, UsageSeriesView, UsageView, is_high

router = APIRouter()

DEFAULT_DAYS = 30
"""The window when no `since` is given: the last 30 days."""


@dataclass(frozen=True)
class Window:
    """What both routes read from the query: the window, by what a row is named, and whose use."""

    start: float
    end: float
    by: Literal["user", "group"]
    user: str | None
    group: str | None


ISO_MOMENT = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:\d{2})?)?$"
"""An ISO 8601 date or time (UTC unless it says otherwise): what `since` and `until` take."""


def _window(
    ctx: CtxDep,
    since: Annotated[
        str | None,
        Query(
            pattern=ISO_MOMENT, description="Start of the window (ISO 8601); default 30 days before its end."
        ),
    ] = None,
    until: Annotated[
        str | None,
        Query(pattern=ISO_MOMENT, description="End of the window (ISO 8601, excluded); default now."),
    ] = None,
    by: Literal["user", "group"] = "user",
    user: PrincipalName | None = None,
    group: PrincipalName | None = None,
) -> Window:
    end = _moment(until, "until") if until is not None else clock.now()
    start = (
        _moment(since, "since") if since is not None else end - timedelta(days=DEFAULT_DAYS).total_seconds()
    )
    if start >= end:
        raise ApiError(422, "since must be before until", field="since", fix="Give an earlier --since")
    _check_length(start, end, ctx.config.limits.usage_window_days)
    return Window(start, end, by, user, group)


def _check_length(start: float, end: float, longest_days: int) -> None:
    """A window is at most `[limits] usage_window_days` long: what one answer costs stays bounded."""
    asked = (end - start) / DAY
    if asked <= longest_days:
        return
    raise ApiError(
        422,
        f"the window from since to until is {asked:,.0f} days; this server answers at most "
        f"[limits] usage_window_days = {longest_days} days at once",
        field="since",
        fix=f"Give a --since and --until at most {longest_days} days apart (ask for a longer span in "
        f"several windows), or ask the platform admin to raise [limits] usage_window_days",
    )


def _moment(text: str, field: str) -> float:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as error:  # the pattern holds, the date does not (2026-02-30)
        raise ApiError(
            422, f"{field}: {error}", field=field, fix="Give a real date, e.g. 2026-11-01"
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


WindowDep = Annotated[Window, Depends(_window)]


@router.get("/usage")
def usage(ctx: CtxDep, caller: CallerDep, w: WindowDep) -> list[UsageView]:
    """One row per user (or group) with use in the window, sorted by name."""
    with ctx.store.read() as s:
        jobs, runs = _records(s, _asked(s, caller, w), w.start, w.end)
    return [_view(a, w) for a in report(jobs, runs, w.start, w.end, NAMES[w.by])]


@router.get("/usage/history")
def usage_history(ctx: CtxDep, caller: CallerDep, w: WindowDep) -> UsageHistoryView:
    """GPU-hours per user (or group) and UTC day, and the tasks waiting to start, hour by hour: the
    dashboard's plots."""
    with ctx.store.read() as s:
        jobs, runs = _records(s, _asked(s, caller, w), w.start, w.end)
        gpus = s.scalar(select(func.coalesce(func.sum(NodeRow.gpus), 0))) or 0
    count = math.ceil((w.end - w.start) / HOUR)
    hours = [w.end - (count - 1 - i) * HOUR for i in range(count)]  # the last one: now
    series = daily_gpu_hours(runs, w.start, w.end, NAMES[w.by])
    return UsageHistoryView(
        by=w.by,
        since=datetime.fromtimestamp(w.start, UTC),
        until=datetime.fromtimestamp(w.end, UTC),
        days=tuple(datetime.fromtimestamp(d, UTC) for d in days(w.start, w.end)),
        series=tuple(
            UsageSeriesView(name=n, gpu_hours=tuple(round(h, 4) for h in v)) for n, v in series.items()
        ),
        cluster_gpus=gpus,
        waiting=tuple(waiting_at(jobs, hours)),
    )


NAMES: dict[str, Callable[[str, str], str]] = {"user": lambda u, g: u, "group": lambda u, g: g}
"""What names a row, by `by`."""


def _asked(s: Session, caller: Caller, w: Window) -> Any:
    """The narrowing of job queries to what was asked, once the caller may see it."""
    groups = _groups(caller, w.by, w.group)
    _check_user(s, caller, w.user)
    return _mine(caller, w.user, groups)


def _view(a: Account, w: Window) -> UsageView:
    return UsageView(
        name=a.name,
        by=w.by,
        since=datetime.fromtimestamp(w.start, UTC),
        until=datetime.fromtimestamp(w.end, UTC),
        jobs=a.jobs,
        ended=dict(sorted(a.ended.items())),
        gpu_hours=round(a.gpu_hours, 4),
        high_gpu_hours=round(a.high_gpu_hours, 4),
        low_gpu_hours=round(a.low_gpu_hours, 4),
        lost_gpu_hours=round(a.lost_gpu_hours, 4),
        waits=len(a.waits),
        wait_p50_seconds=a.wait_percentile(50),
        wait_p95_seconds=a.wait_percentile(95),
    )


def _groups(caller: Caller, by: str, group: str | None) -> list[str] | None:
    """The groups whose use is asked for (None: any the caller may list). A group's use, and its
    totals, are for those who administer it."""
    if group is not None:
        if not caller.administers(group):
            raise ApiError(
                403, f"you may not see the use of group {group}", field="group",
                fix="Leave out --group to see your own use; a group's admins see its use",
            )  # fmt: skip
        return [group]
    if by == "group" and not caller.is_platform_admin:
        if not caller.admin_of:
            raise ApiError(
                403, "only a group's admins see its totals", field="by",
                fix="Leave out --by group to see your own use",
            )  # fmt: skip
        return sorted(caller.admin_of)
    return None


def _check_user(s: Session, caller: Caller, user: str | None) -> None:
    """Another user's use is for the admins of their group; the same answer whether or not they exist."""
    if user is None or user == caller.name or caller.is_platform_admin:
        return
    owner = s.get(UserRow, user)
    if owner is None or not caller.administers(owner.group_name):
        raise ApiError(
            403, f"you may not see {user}'s use", field="user",
            fix="Leave out --user to see your own use, or name a user of a group you administer",
        )  # fmt: skip


def _mine(caller: Caller, user: str | None, groups: list[str] | None) -> Any:
    """Narrows a query over jobs to those asked for, of those the caller may list."""

    def narrow(query: Select[Any]) -> Select[Any]:
        query = listable(query, caller)
        if user is not None:
            query = query.where(JobRow.user_name == user)
        if groups is not None:
            query = query.where(JobRow.group_name.in_(groups))
        return query

    return narrow


def _records(s: Session, narrow: Any, start: float, end: float) -> tuple[list[JobRecord], list[Run]]:
    """The jobs and runs that count in [start, end)."""
    first = (
        select(InstanceRow.job_id, func.min(InstanceRow.started_at).label("first"))
        .group_by(InstanceRow.job_id)
        .subquery()
    )
    # Every job alive at some time in the window: what it counts for is decided in `accounting`.
    jobs_q = (
        select(JobRow.user_name, JobRow.group_name, JobRow.submitted_at, first.c.first, JobRow.ended_at)
        .add_columns(JobRow.state)
        .outerjoin(first, first.c.job_id == JobRow.id)
        .where(JobRow.submitted_at < end, or_(JobRow.ended_at.is_(None), JobRow.ended_at >= start))
    )
    runs_q = (
        select(JobRow.user_name, JobRow.group_name, JobRow.max_schedule)
        .add_columns(func.coalesce(InstanceRow.gpus, JobRow.workers * JobRow.gpus_per_worker))
        .add_columns(InstanceRow.started_at, InstanceRow.ended_at)
        .add_columns(InstanceRow.lost_gpu_seconds)
        .join(JobRow, JobRow.id == InstanceRow.job_id)
        .where(InstanceRow.started_at < end)
        .where(or_(InstanceRow.ended_at.is_(None), InstanceRow.ended_at > start))
    )
    jobs = [JobRecord(*row) for row in s.execute(narrow(jobs_q))]
    runs = [
        Run(u, g, is_high(ms), gpus, t0, t1, lost)
        for u, g, ms, gpus, t0, t1, lost in s.execute(narrow(runs_q))
        if t0 is not None
    ]
    return jobs, runs
