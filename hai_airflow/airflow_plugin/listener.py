"""Mirrors the hai quotas into Airflow pools when an Airflow service (scheduler, triggerer...) starts."""

from __future__ import annotations

import logging
from typing import Any

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)


class PoolSyncListener:
    """Syncs the ``hai_<group>`` pools once per service start; never stops the service from starting.

    The connection is ``[hai] pool_sync_conn_id`` (default ``hai_default``).
    """

    @hookimpl
    def on_starting(self, component: Any) -> None:
        from airflow.jobs.job import Job

        # task runners call this too; only long-running services own the pools
        if not isinstance(component, Job):
            return
        from airflow.configuration import conf

        from hai_airflow.airflow_plugin.pools import sync_pools

        try:
            changes = sync_pools(conf.get("hai", "pool_sync_conn_id", fallback="hai_default"))
        except Exception as e:
            log.warning("hai pools not synced (%s); run `hai airflow sync-pools` once the server is up", e)
            return
        log.info(
            "hai pools synced: %s", ", ".join(f"{c.pool}={c.slots} ({c.action})" for c in changes) or "none"
        )
