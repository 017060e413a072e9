"""The queue as users see it: order, priority weight with its terms, and why each job waits;
others' jobs only as what the queue needs.

The order and the reasons come from the controller's last plan (`Forecaster.planned`), never from a
plan per request: a request costs a read of the waiting jobs, however many ask at once. A server whose
controller has not planned (a standby, or one just started) makes one plan that every request asking
meanwhile shares (`SharedPlan`)."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from functools import partial

import anyio
from pydantic import TypeAdapter
from sqlalchemy import select
from sqlalchemy.orm import Session

from hai_airflow.scheduling import plan, weight
from hai_airflow.scheduling.fairshare import FairShare
from hai_airflow.scheduling.model import Admit, Decision, Reject, Wait
from hai_airflow.scheduling.policies import POLICIES, SortKey
from hai_airflow.server.control.mirror import read_all
from hai_airflow.server.jobs.auth import Caller
from hai_airflow.server.jobs.holds import hold_reason, owners_hold
from hai_airflow.server.jobs.kept import KeptJob
from hai_airflow.server.jobs.queue_forecast import QueueForecast
from hai_airflow.server.jobs.snapshot import WAITING, planner_job, schedulable, unfinished_jobs
from hai_airflow.server.jobs.views import job_view, other_job_view
from hai_airflow.server.process.context import Forecasts, ServerContext
from hai_airflow.server.store import clock, in_lists
from hai_airflow.server.store.database import Store
from hai_airflow.server.store.tables import InstanceRow, JobRow
from hai_airflow.spec import QueueEntryView, QueueJobView, WeightTermView

VIEWS_AT_ONCE = 2
"""Queue views built at once in a server. Each reads and serializes the whole queue; more requests wait
their turn on the event loop, holding no thread nor database connection, so a flood of them leaves
other users' requests the rest of the pool and most of the interpreter."""
_BUILDING = anyio.CapacityLimiter(VIEWS_AT_ONCE)
_ENTRIES: TypeAdapter[list[QueueEntryView]] = TypeAdapter(list[QueueEntryView])

CURRENT_SECONDS = 30.0
"""The controller's plan is the queue's while it is younger than this: an active controller plans at
least every `settled.REPLAN_SECONDS`; an older one is a controller that stood by or stopped."""


@dataclass(frozen=True)
class QueuePlan:
    """The decisions of one plan, in queue order, and when it was made."""

    at: float
    decisions: Sequence[Decision]
    fair_share: FairShare | None = None
    """The users' recent use the plan weighed low-priority jobs by (None: no fair-share term)."""


class SharedPlan:
    """One plan for the requests of a server whose controller has not planned: kept while the store
    has not changed, and shared by every request that asked while it was being made; one at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: tuple[tuple[int, int], float, QueuePlan] | None = None
        """The change-feed cursor it was made at, when it was done (monotonic), and the plan."""

    def get(self, session: Session, policy: str) -> QueuePlan:
        asked = time.monotonic()
        with self._lock:
            made = self._made
            if made is not None and made[1] >= asked:
                return made[2]  # made while this request waited for it
            kept = read_all(session, policy)
            if made is not None and made[0] == kept.last_change:
                return made[2]
            view, now = kept.view(), clock.now()
            fresh = QueuePlan(now, plan(view.snapshot, now, view.usage), view.snapshot.fair_share)
            self._made = (kept.last_change, time.monotonic(), fresh)
            return fresh


_SHARED: weakref.WeakKeyDictionary[Store, SharedPlan] = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def current_plan(session: Session, store: Store, policy: str, forecaster: Forecasts | None) -> QueuePlan:
    """The controller's last plan while it is current, else the plan shared by this store's requests."""
    offer = forecaster.planned if forecaster is not None else None
    if offer is not None and offer.decisions is not None and clock.now() - offer.at < CURRENT_SECONDS:
        return QueuePlan(offer.at, offer.decisions, offer.snapshot.fair_share)
    with _SHARED_LOCK:
        shared = _SHARED.setdefault(store, SharedPlan())
    return shared.get(session, policy)


def _last_preemptor(session: Session, job_ids: list[int]) -> dict[int, int]:
    """Per job, who preempted its latest instance (when that instance was preempted)."""
    if not job_ids:
        return {}
    last: dict[int, int | None] = {}
    for part in in_lists.chunks(job_ids):
        rows = session.execute(
            select(InstanceRow.job_id, InstanceRow.preempted_by)
            .where(InstanceRow.job_id.in_(part))
            .order_by(InstanceRow.id)
        )
        for job_id, by in rows:  # a job's instances all fall in its own chunk, in id order
            last[job_id] = by
    return {j: by for j, by in last.items() if by is not None}


def queued_job(row: JobRow, caller: Caller, now: float) -> QueueJobView:
    """The job in full if the caller may see it (`Caller.may_see`), else only what the queue needs."""
    if caller.may_see(row.user_name, row.group_name):
        return job_view(row, None, now)
    return other_job_view(row)


def _unplanned_reason(row: JobRow, shown: bool) -> str:
    """Why a job the planner skipped waits; who asked is named only to those who may see the job."""
    if row.cancel_requested:
        return f"being cancelled (asked by {row.cancel_by})" if shown else "being cancelled"
    if row.blocked and not row.held:
        return (row.reason or "waiting for other tasks") if shown else "waiting for other tasks"
    if shown:
        return hold_reason(row)
    return "held by its owner" if owners_hold(row) else "suspended by an admin"


async def queue_json(ctx: ServerContext, caller: Caller) -> bytes:
    """`GET /queue`'s answer as JSON, built in one of VIEWS_AT_ONCE threads of its own."""
    return await anyio.to_thread.run_sync(partial(_queue_json, ctx, caller), limiter=_BUILDING)


def _queue_json(ctx: ServerContext, caller: Caller) -> bytes:
    policy = ctx.config.server.policy
    with ctx.store.read() as s:
        last = current_plan(s, ctx.store, policy, ctx.forecaster)
        entries = queue_entries(s, last, policy, caller, forecast=ctx.forecast)
    return _ENTRIES.dump_json(entries)


_KEPT_FIELDS = tuple(f.name for f in fields(KeptJob))


def kept_job(row: JobRow) -> KeptJob:
    """A job's row as the record the planner's view of it is made from."""
    return KeptJob(*(getattr(row, name) for name in _KEPT_FIELDS))


@dataclass(frozen=True)
class _Shown:
    """One queue entry before it is a view: the job, and why it waits."""

    row: JobRow
    reason: str
    behind: int | None = None


def _planned(decisions: Sequence[Decision]) -> Iterator[tuple[int, str, int | None]]:
    """The jobs a plan decided on, in queue order, with why each waits (or starts, or cannot run)."""
    for d in decisions:
        if isinstance(d, Admit):
            yield d.job_id, f"starting: {d.reason}", None
        elif isinstance(d, Wait):
            yield d.job_id, d.reason, d.blocked_by
        elif isinstance(d, Reject):
            yield d.job_id, f"cannot run: {d.reason}", None


def _in_order(last: QueuePlan, rows: dict[int, JobRow], policy: str, caller: Caller) -> list[_Shown]:
    """The waiting jobs in the plan's order; those queued since it was made go where the policy's
    order puts them, with the reason they were stored with; held ones, and those waiting for others,
    last."""
    key = POLICIES[policy].queue_key
    ready = {i: r for i, r in rows.items() if r.state in WAITING and schedulable(r)}
    keys: dict[int, SortKey] = {
        i: key(planner_job(kept_job(r), None), last.at, last.fair_share) for i, r in ready.items()
    }
    planned = [(i, why, behind) for i, why, behind in _planned(last.decisions) if i in ready]
    seen = {i for i, _, _ in planned}
    arrived = sorted((i for i in ready if i not in seen), key=keys.__getitem__)
    shown: list[_Shown] = []
    for job_id, why, behind in planned:
        while arrived and keys[arrived[0]] < keys[job_id]:
            new = rows[arrived.pop(0)]
            shown.append(_Shown(new, new.reason or "waiting for the scheduler"))
        shown.append(_Shown(rows[job_id], why, behind))
    shown += [_Shown(rows[i], rows[i].reason or "waiting for the scheduler") for i in arrived]
    for row in sorted(rows.values(), key=lambda r: r.id):
        if row.state in WAITING and row.id not in ready:
            shown.append(_Shown(row, _unplanned_reason(row, caller.may_see(row.user_name, row.group_name))))
    return shown


def queue_entries(
    session: Session,
    last: QueuePlan,
    policy: str,
    caller: Caller,
    now: float | None = None,
    forecast: QueueForecast | None = None,
) -> list[QueueEntryView]:
    """Waiting jobs in the order the plan `last` serves them, each with its `forecast` (another user's
    with the time only); held ones last."""
    now = clock.now() if now is None else now
    rows = {r.id: r for r in unfinished_jobs(session)}
    shown = _in_order(last, rows, policy, caller)
    preempted_by = _last_preemptor(session, [s.row.id for s in shown])
    entries: list[QueueEntryView] = []
    for position, s in enumerate(shown, start=1):
        row, may_see = s.row, caller.may_see(s.row.user_name, s.row.group_name)
        w = weight(planner_job(kept_job(row), None), now, last.fair_share)
        entries.append(
            QueueEntryView(
                position=position,
                job=queued_job(row, caller, now),
                weight=w.score,
                terms=tuple(WeightTermView(name=t.name, value=t.value, note=t.note) for t in w.terms),
                reason=s.reason,
                waiting_behind=s.behind,
                preempted_by=preempted_by.get(row.id),
                forecast=forecast.view(row.id, full=may_see, sees=caller.may_see) if forecast else None,
            )
        )
    return entries
