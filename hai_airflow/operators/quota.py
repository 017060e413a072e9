"""A high-priority task and its group's quota: the Airflow pool it holds, and waiting in a worker."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hai_airflow.airflow_plugin.pools import pool_name
from hai_airflow.client import HaiClient
from hai_airflow.hooks.identity import Acting
from hai_airflow.spec import is_high


def quota_pool_gpus(
    *, max_schedule: int | str, on_over_quota: str, gpus: Callable[[], int | None]
) -> int | None:
    """The slots of its group's pool a task holds: the job's GPUs when it is high priority and waits
    for quota, both as literals; None: no pool. `gpus` is asked only then."""
    if on_over_quota != "wait" or not isinstance(max_schedule, int) or not is_high(max_schedule):
        return None
    return gpus() or None


def warn_other_group(resource_group: str | None, acting: Acting, log: Any) -> None:
    """A pool named for another group than the acting user's would count against the wrong quota."""
    if resource_group is not None and acting.group and acting.group != resource_group:
        log.warning(
            "resource_group=%r, but %s is in group %r: the task holds pool %s while the job counts "
            "against %s's quota; set resource_group=%r or leave it None",
            resource_group,
            acting.user,
            acting.group,
            pool_name(resource_group),
            acting.group,
            acting.group,
        )


def wait_here(client: HaiClient, gpus: int, poll_interval: float) -> None:
    """Hold the worker until the quota covers `gpus` (an operator that does not defer)."""
    while not client.check_high_priority(gpus).get("allowed"):
        time.sleep(poll_interval)
