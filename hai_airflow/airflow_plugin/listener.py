"""Keeps the hai quotas mirrored as Airflow pools while Airflow's scheduler runs."""

from __future__ import annotations

import logging
import threading
from typing import Any, ClassVar

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 15.0
"""Seconds between two syncs: how long a quota change or a hai server that came up late may take
to reach the pools."""


class PoolFollower:
    """Syncs the ``hai_<group>`` pools now and then every `interval` seconds, in a daemon thread.

    So the pools follow the cluster without a manual step: a hai server that starts after Airflow,
    a group added, a quota raised. It logs what changed, and a failure once until the next success;
    it never stops the service it runs in.
    """

    def __init__(self, conn_id: str, interval: float, owner: Any = None) -> None:
        self.conn_id = conn_id
        self.interval = interval
        self.owner = owner
        self.stopped = threading.Event()
        self._failing = False
        self.thread = threading.Thread(target=self._run, name="hai-pool-follower", daemon=True)

    def start(self) -> PoolFollower:
        self.thread.start()
        return self

    def sync_once(self) -> None:
        from hai_airflow.airflow_plugin.pools import sync_pools

        try:
            changes = sync_pools(self.conn_id)
        except Exception as e:
            if not self._failing:
                log.warning("hai pools not synced (%s); trying again every %.0f s", e, self.interval)
            self._failing = True
            return
        changed = [c for c in changes if c.action != "unchanged"]
        if changed or self._failing:
            log.info(
                "hai pools synced: %s",
                ", ".join(f"{c.pool}={c.slots} ({c.action})" for c in changed) or "none changed",
            )
        self._failing = False

    def _is_scheduler(self) -> bool:
        """Whether the job this runs in is the scheduler, the pools' one owner.

        Airflow calls the listener as a job is made, before the job's runner names its type.
        """
        for _ in range(100):
            if self.owner is None or self.owner.job_type is not None:
                break
            self.stopped.wait(0.1)
        return self.owner is None or self.owner.job_type == "SchedulerJob"

    def _run(self) -> None:
        if not self._is_scheduler():
            return
        while not self.stopped.is_set():
            self.sync_once()
            if self.interval <= 0:
                return
            self.stopped.wait(self.interval)


class PoolSyncListener:
    """Starts a :class:`PoolFollower` in each Airflow service; only the scheduler's syncs.

    The connection is ``[hai] pool_sync_conn_id`` (default ``hai_default``), the period
    ``[hai] pool_sync_interval`` seconds (default 15; 0 syncs once at start).
    """

    followers: ClassVar[dict[int, PoolFollower]] = {}
    """By the id of the job each runs in, so the job's end stops its own."""

    @hookimpl
    def on_starting(self, component: Any) -> None:
        from airflow.jobs.job import Job

        # task runners call this too; only long-running services may own the pools
        if not isinstance(component, Job):
            return
        from airflow.configuration import conf

        conn_id = conf.get("hai", "pool_sync_conn_id", fallback="hai_default")
        interval = conf.getfloat("hai", "pool_sync_interval", fallback=DEFAULT_INTERVAL_S)
        PoolSyncListener.followers[id(component)] = PoolFollower(conn_id, interval, owner=component).start()

    @hookimpl
    def before_stopping(self, component: Any) -> None:
        follower = PoolSyncListener.followers.pop(id(component), None)
        if follower is not None:
            follower.stopped.set()
