"""What each page shows, fetched through the REST client (the dashboard has no other data source)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timedelta

from hai_airflow.client import AsyncHaiClient, HaiError
from hai_airflow.dashboard.charts import Chart, gpu_hours_by_day, utilisation_by_day, waiting_by_hour
from hai_airflow.dashboard.formatting import clock
from hai_airflow.dashboard.svg import Bar, NodeGrid, Timeline, job_timeline, node_grid, quota_bar
from hai_airflow.jobfile import job_file
from hai_airflow.scheduling.eta import start_estimate
from hai_airflow.spec import (
    PLACED,
    TERMINAL_STATES,
    UNFINISHED,
    InstanceView,
    JobDetailView,
    JobState,
    JobView,
    QueueEntryView,
    QuotaView,
    UsageHistoryView,
    UsageView,
)


def _states(group: frozenset[JobState]) -> str:
    """The `state` filter of the jobs list for a group of states, in the order of `JobState`."""
    return ",".join(s.value for s in JobState if s in group)


SHOWN_UNFINISHED = _states(UNFINISHED)
LIST_PAGE = 50
"""Tasks on one page of the task list."""
ACTIVE = _states(PLACED)
LOG_TAIL_LINES = 200


@dataclass(frozen=True)
class QueueRow:
    entry: QueueEntryView
    eta: str
    eta_note: str


@dataclass(frozen=True)
class QueuePage:
    rows: tuple[QueueRow, ...]
    running: tuple[JobView, ...]


@dataclass(frozen=True)
class MemberQuota:
    user: str
    bar: Bar
    jobs: tuple[JobView, ...]


@dataclass(frozen=True)
class GroupQuota:
    view: QuotaView
    bar: Bar
    members: tuple[MemberQuota, ...]


@dataclass(frozen=True)
class QuotaPage:
    me: QuotaView
    groups: tuple[GroupQuota, ...]


@dataclass(frozen=True)
class NodesPage:
    grids: tuple[NodeGrid, ...]
    jobs: dict[int, JobView]

    @property
    def total(self) -> int:
        return sum(g.node.gpus for g in self.grids)

    @property
    def free(self) -> int:
        return sum(len(g.node.free_gpus) for g in self.grids)


@dataclass(frozen=True)
class JobsFilter:
    """What the task list shows: a state (or none), one user's tasks (or all the viewer may see),
    those whose labels a selector matches (or all)."""

    state: str = ""
    user: str = ""
    before: int | None = None
    labels: str = ""


@dataclass(frozen=True)
class JobsPage:
    filter: JobsFilter
    jobs: tuple[JobView, ...]
    older: int | None
    """The `before` of the next page, when there may be one."""


@dataclass(frozen=True)
class JobPage:
    job: JobDetailView
    instances: tuple[InstanceView, ...]
    timeline: Timeline
    log_instance: InstanceView | None
    log: str

    @property
    def spec(self) -> str:
        """The job's spec as the job file `hai task N -o yaml` prints."""
        return job_file(self.job.spec)

    @property
    def finished(self) -> bool:
        return self.job.state in TERMINAL_STATES


ETA_TEXT = {"now": "now", "grace": "≈ {}", "promise": "by {}", "forecast": "~ {}", "unknown": "—"}
"""How each kind of start estimate reads on the page."""


def _eta(entry: QueueEntryView, blockers: dict[int, JobDetailView]) -> tuple[str, str]:
    """The shared start estimate (`scheduling.eta`, the one `hai queue` shows too) as page text."""
    blocker = blockers.get(entry.waiting_behind) if entry.waiting_behind is not None else None
    estimate = start_estimate(entry, blocker)
    return ETA_TEXT[estimate.kind].format(clock(estimate.at)), estimate.note


async def _visible_job(client: AsyncHaiClient, job_id: int) -> JobDetailView | None:
    try:
        return await client.job(job_id)
    except HaiError as error:
        if error.status in (403, 404):
            return None
        raise


async def queue_page(client: AsyncHaiClient) -> QueuePage:
    entries, active = await asyncio.gather(client.queue(), client.jobs(all=True, state=ACTIVE))
    blocker_ids = sorted({e.waiting_behind for e in entries if e.waiting_behind is not None})
    found = await asyncio.gather(*(_visible_job(client, b) for b in blocker_ids))
    blockers = {b: job for b, job in zip(blocker_ids, found, strict=True) if job is not None}
    rows = tuple(QueueRow(e, *_eta(e, blockers)) for e in entries)
    running = sorted(active, key=lambda j: (-j.runtime_seconds, j.id))
    return QueuePage(rows, tuple(running))


async def quota_page(client: AsyncHaiClient) -> QuotaPage:
    unfinished, quotas, me = await asyncio.gather(
        client.jobs(all=True, state=SHOWN_UNFINISHED), client.quotas(), client.quota()
    )
    high = [j for j in unfinished if j.priority == "high"]
    groups = []
    for q in quotas:
        members = tuple(
            MemberQuota(
                u.user,
                quota_bar(u.used_gpus, u.quota_gpus),
                tuple(
                    sorted((j for j in high if j.user == u.user and j.group == q.group), key=lambda j: j.id)
                ),
            )
            for u in q.users
        )
        groups.append(GroupQuota(q, quota_bar(q.group_used_gpus, q.group_quota_gpus), members))
    return QuotaPage(me, tuple(groups))


async def nodes_page(client: AsyncHaiClient) -> NodesPage:
    nodes, unfinished = await asyncio.gather(client.nodes(), client.jobs(all=True, state=SHOWN_UNFINISHED))
    grids = tuple(node_grid(n) for n in sorted(nodes, key=lambda n: n.name))
    return NodesPage(grids, {j.id: j for j in unfinished})


async def jobs_page(client: AsyncHaiClient, f: JobsFilter) -> JobsPage:
    """Newest first, a page at a time; the server decides whose tasks the viewer may list."""
    found = await client.jobs(
        user=f.user or None, state=f.state or None, all=True, limit=LIST_PAGE, before=f.before,
        selector=f.labels or None,
    )
    older = found[-1].id if len(found) == LIST_PAGE else None
    return JobsPage(f, tuple(found), older)


async def job_page(client: AsyncHaiClient, job_id: int, instance_id: int | None, now: datetime) -> JobPage:
    job, listed = await asyncio.gather(client.job(job_id), client.instances(job_id))
    instances = tuple(listed)
    chosen = next((i for i in instances if i.id == instance_id), None) if instance_id else None
    chosen = chosen or (max(instances, key=lambda i: i.id) if instances else None)
    log = await client.log(chosen.id, tail=LOG_TAIL_LINES) if chosen is not None else ""
    return JobPage(job, instances, job_timeline(job, list(instances), now), chosen, log)


USAGE_DAYS = 14
"""The window of the Usage page: the last two weeks."""


@dataclass(frozen=True)
class UsagePage:
    rows: tuple[UsageView, ...]
    """The window's totals, one row per user or group."""
    history: UsageHistoryView
    gpu_hours: Chart
    utilisation: Chart
    waiting: Chart


async def usage_page(client: AsyncHaiClient, now: datetime) -> UsagePage:
    """By group for those who administer one (a platform admin sees every group), else the viewer's own."""
    since = now - timedelta(days=USAGE_DAYS)
    try:
        rows, history = await asyncio.gather(
            client.usage(since=since, until=now, by="group"),
            client.usage_history(since=since, until=now, by="group"),
        )
    except HaiError as error:
        if error.status != 403:
            raise
        rows, history = await asyncio.gather(
            client.usage(since=since, until=now), client.usage_history(since=since, until=now)
        )
    return UsagePage(
        tuple(rows), history, gpu_hours_by_day(history), utilisation_by_day(history), waiting_by_hour(history)
    )
