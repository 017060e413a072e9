"""What `hai serve` exports at /metrics in the Prometheus text format."""

from __future__ import annotations

import hmac
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator

from fastapi import Request
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hai_airflow.server.errors import ApiError
from hai_airflow.server.jobs.auth import verify
from hai_airflow.server.jobs.nodes import node_usage
from hai_airflow.server.jobs.snapshot import WAITING
from hai_airflow.server.store import clock, lease
from hai_airflow.server.store.database import Store
from hai_airflow.server.store.tables import InstanceRow, JobRow
from hai_airflow.spec import priority_class

UNMATCHED = "unmatched"
"""The route label of a request no route matched (a 404), so stray paths cannot grow the label set."""


SCRAPE_FIX = (
    "Send `Authorization: Bearer <token>` with the [server] metrics_token (Prometheus: "
    "`authorization: {credentials_file: ...}` in the scrape job) or a platform admin's token"
)


def _bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def require_scraper(request: Request, metrics_token: str | None) -> None:
    """/metrics names groups, GPU types and the controller's host: the metrics token or a platform admin."""
    presented = _bearer(request)
    if metrics_token and presented and hmac.compare_digest(presented.encode(), metrics_token.encode()):
        return
    if not verify(request).is_platform_admin:
        raise ApiError(
            403,
            "only a platform admin or the metrics token may read /metrics",
            field="Authorization",
            fix=SCRAPE_FIX,
        )


class ServerMetrics:
    """One registry per server context: counters the controller and the API feed, and gauges read from
    the store at each scrape (so they agree with the API whichever server holds the lease).

    :param store: the store the gauges are read from.
    :param holder_id: this server's controller identity, exported as 0 while another one leads.
    """

    def __init__(self, store: Store, holder_id: str) -> None:
        self.registry = CollectorRegistry()
        self.admissions = Counter(
            "hai_admissions",
            "Instances the controller started (admitted jobs, resumes included).",
            registry=self.registry,
        )
        self.resumes = Counter(
            "hai_resumes",
            "Admissions of a job that had run before (after a suspension, a loss or an admin hold).",
            registry=self.registry,
        )
        self.suspensions = Counter(
            "hai_suspensions",
            "Instances that ended with their job going back to the queue, by end reason "
            "(preempted, suspended: admin hold or exit 75, lost).",
            ["reason"],
            registry=self.registry,
        )
        self.lost_gpu_seconds = Counter(
            "hai_lost_gpu_seconds",
            "GPU-seconds of work since the last checkpoint (or since the start) thrown away when a "
            "non-elastic job was suspended.",
            registry=self.registry,
        )
        self.planner_cycle = Histogram(
            "hai_planner_cycle_seconds",
            "Duration of one controller cycle: snapshot, plan, and applying the decisions.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.settled_cycles = Counter(
            "hai_planner_settled_cycles",
            "Controller cycles that did not plan: since a plan that only made jobs wait, nothing changed "
            "but new jobs that wait anyway.",
            registry=self.registry,
        )
        self.kept_state_drifts = Counter(
            "hai_controller_kept_state_drifts",
            "Full reads of the store (every few minutes) that found the controller's kept cluster state "
            "differing from it: a write that bypassed the change feed. Alert on any increase.",
            registry=self.registry,
        )
        self.request_latency = Histogram(
            "hai_api_request_duration_seconds",
            "Time until the response starts, by route template and method.",
            ["route", "method"],
            registry=self.registry,
        )
        self.registry.register(_StoreCollector(store, holder_id))

    def instance_ended(self, end_reason: str, requeued: bool, lost_gpu_seconds: float) -> None:
        if requeued:
            self.suspensions.labels(reason=end_reason).inc()
        if lost_gpu_seconds > 0:
            self.lost_gpu_seconds.inc(lost_gpu_seconds)

    def observe_request(self, route: str, method: str, seconds: float) -> None:
        self.request_latency.labels(route=route, method=method).observe(seconds)

    def admitted(self, resume: bool) -> None:
        self.admissions.inc()
        if resume:
            self.resumes.inc()


def lost_gpu_seconds(job: JobRow, inst: InstanceRow, ended_at: float) -> float:
    """GPU-seconds an instance ran past the job's latest checkpoint (or its start, if none came since)."""
    if inst.started_at is None:
        return 0.0
    since = max(inst.started_at, job.latest_checkpoint_at or 0.0)
    return max(0.0, ended_at - since) * job.workers * job.gpus_per_worker


class _StoreCollector(Collector):
    """Gauges computed from the store when Prometheus scrapes."""

    def __init__(self, store: Store, holder_id: str) -> None:
        self.store = store
        self.holder_id = holder_id

    def describe(self) -> list[Metric]:
        # Describing without a store read keeps registration free of I/O.
        return list(_gauges())

    def collect(self) -> Iterator[Metric]:
        queued, allocated, free, holder, drained = _gauges()
        with self.store.read() as s:
            for (priority, group), n in sorted(_queued(s).items()):
                queued.add_metric([priority, group], n)
            used: Tally[str] = Tally()
            idle: Tally[str] = Tally()
            out = 0
            for u in node_usage(s):
                out += u.row.drained
                if u.row.gpus > 0:
                    used[u.row.gpu_type] += len(u.holders)
                    idle[u.row.gpu_type] += len(u.free_gpus)
            held = lease.current(s, clock.now())
            current = held.holder if held is not None else None
        for gpu_type in sorted(used):
            allocated.add_metric([gpu_type], used[gpu_type])
            free.add_metric([gpu_type], idle[gpu_type])
        if current is not None:
            holder.add_metric([current], 1)
        if current != self.holder_id and self.holder_id:
            holder.add_metric([self.holder_id], 0)
        drained.add_metric([], out)
        yield from (queued, allocated, free, holder, drained)


def _gauges() -> tuple[GaugeMetricFamily, ...]:
    return (
        GaugeMetricFamily(
            "hai_queued_jobs",
            "Jobs waiting for GPUs (pending or suspended), by priority class and group.",
            labels=["priority", "group"],
        ),
        GaugeMetricFamily("hai_gpus_allocated", "GPUs held by instances, by GPU type.", labels=["gpu_type"]),
        GaugeMetricFamily("hai_gpus_free", "GPUs no instance holds, by GPU type.", labels=["gpu_type"]),
        GaugeMetricFamily(
            "hai_controller_lease_holder",
            "1 for the server whose controller holds the lease; 0 for this server while it stands by.",
            labels=["holder"],
        ),
        GaugeMetricFamily(
            "hai_nodes_drained",
            "Nodes an admin drained (no new placement; jobs on them run to their end), empty or not.",
            labels=[],
        ),
    )


def _queued(s: Session) -> Tally[tuple[str, str]]:
    rows = s.execute(select(JobRow.max_schedule, JobRow.group_name).where(JobRow.state.in_(WAITING)))
    return Tally((priority_class(max_schedule), group) for max_schedule, group in rows)


class RequestTimer:
    """ASGI middleware observing each HTTP request's time to its response start.

    Time to the start, not the end, so followed logs and long-polls measure the server's answer,
    not how long the client listens. The route label is the matched template (`/api/v1/jobs/{job_id}`),
    never the raw path, which would make one time series per job.
    """

    def __init__(self, app: ASGIApp, observe: Callable[[str, str, float], None]) -> None:
        self.app = app
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        outer_root = scope.get("root_path", "")
        observed = False

        def observe() -> None:
            nonlocal observed
            if not observed:
                observed = True
                self.observe(_route_template(scope, outer_root), scope["method"], time.perf_counter() - t0)

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                observe()
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            observe()


def _route_template(scope: Scope, outer_root: str) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    if not isinstance(path, str):
        return UNMATCHED
    # A mounted app (the dashboard at /ui) extends root_path; its routes' templates are relative to it.
    mount = str(scope.get("root_path", ""))[len(outer_root) :]
    return mount + path
