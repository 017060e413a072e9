"""Whether Airflow has a triggerer to hand a deferred wait to, from the API server's health report."""

from __future__ import annotations

from typing import Any

import httpx
from airflow.sdk import conf
from airflow.sdk.exceptions import AirflowException

HEALTH_PATH = "/api/v2/monitor/health"


def triggerer_down(health: dict[str, Any]) -> bool:
    """The health report says no triggerer is alive (none ever started, or its heartbeat is stale)."""
    triggerer = health.get("triggerer")
    return isinstance(triggerer, dict) and triggerer.get("status") != "healthy"


def no_triggerer(base_url: str, timeout: float = 3.0) -> bool:
    """True only when the API server at `base_url` answers that no triggerer runs.

    Any doubt (no API server there, as under ``dag.test()``; an error; another answer) is False,
    so the task defers as asked: only a clear answer may fail a task.
    """
    if not base_url:
        return False
    try:
        resp = httpx.get(base_url.rstrip("/") + HEALTH_PATH, timeout=timeout)
        return resp.status_code == 200 and triggerer_down(resp.json())
    except (httpx.HTTPError, ValueError):
        return False


def check_triggerer(deferrable: bool) -> None:
    """Fail before submitting when a deferred wait could never resume: Airflow reports no triggerer."""
    if deferrable and no_triggerer(conf.get("api", "base_url", fallback="")):
        raise AirflowException(
            "deferrable, but Airflow reports no running triggerer, so the deferred wait would never "
            "resume. Start `airflow triggerer`, or set deferrable=False ([operators] "
            "default_deferrable = False) to wait in the worker"
        )
