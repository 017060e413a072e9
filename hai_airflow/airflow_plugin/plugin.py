"""HaiPlugin: what Airflow loads through the `airflow.plugins` entry point (or plugins/hai_plugin.py)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from hai_airflow.airflow_plugin.listener import PoolSyncListener
from hai_airflow.airflow_plugin.priority import HaiPriorityWeightStrategy
from hai_airflow.dashboard import airflow_mount
from hai_airflow.dashboard.extra_link import HaiJobLink


class HaiPlugin(AirflowPlugin):
    """The priority strategy, the pool sync on service start, and the dashboard ("GPU training") at /hai."""

    name = "hai"
    priority_weight_strategies = [HaiPriorityWeightStrategy]  # noqa: RUF012 (Airflow's own attribute)
    listeners = [PoolSyncListener()]  # noqa: RUF012
    fastapi_apps = airflow_mount.fastapi_apps()
    external_views = airflow_mount.external_views()
    operator_extra_links = [HaiJobLink()]  # noqa: RUF012
