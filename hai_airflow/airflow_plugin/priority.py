"""HaiPriorityWeightStrategy: Airflow runs tasks that submit high-priority hai jobs first."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow.task.priority_strategy import PriorityWeightStrategy

from hai_airflow.scheduling.model import Job
from hai_airflow.scheduling.weight import weight
from hai_airflow.spec import JobState, priority_class

if TYPE_CHECKING:
    from airflow.models.taskinstance import TaskInstance

WEIGHT_EPOCH = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
"""Every task's weight is the platform weight at this one instant, so weights computed at
different times still order by deadline (the value Airflow stores never changes afterwards)."""

INT32 = (-(2**31), 2**31 - 1)
_PARAM_TEMPLATE = re.compile(r"^\{\{\s*params(?:\.(\w+)|\[\s*['\"](\w+)['\"]\s*\])\s*\}\}$")


def declared_max_schedule(task: Any) -> int | None:
    """The `max_schedule` a hai operator declared, or None for other tasks and unknown values.

    A literal number counts as is; ``{{ params.NAME }}`` counts with the param's default (a
    value given only in a run's conf is not visible when Airflow computes weights).
    """
    value = getattr(task, "hai_max_schedule", None)
    if isinstance(value, str):
        match = _PARAM_TEMPLATE.match(value.strip())
        if match is None:
            return None
        value = _param_default(getattr(task, "params", None), match.group(1) or match.group(2))
    try:
        return int(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def _param_default(params: Any, name: str) -> Any:
    if params is None:
        return None
    try:
        param = params.get_param(name) if hasattr(params, "get_param") else params[name]
    except (KeyError, TypeError):
        return None
    return getattr(param, "value", param)


def hai_weight(max_schedule: int, created_at: float) -> int:
    """Airflow weight of a task whose job would be submitted at `created_at` (no base weight).

    High priority: the platform's weight of that job at `WEIGHT_EPOCH` (earliest deadline =
    highest); low priority: 0, so it keeps Airflow's usual order after every high one.
    """
    if priority_class(max_schedule) == "low":
        return 0
    # a high-priority job holds GPUs (a CPU job never is high): one stands for any count
    job = Job(
        id=0,
        user="",
        group="",
        state=JobState.PENDING,
        max_schedule=max_schedule,
        submitted_at=created_at,
        gpus_per_worker=1,
    )
    return round(weight(job, WEIGHT_EPOCH).score)


class HaiPriorityWeightStrategy(PriorityWeightStrategy):
    """Tasks that submit high-priority hai jobs run first, earliest deadline first.

    The weight is the task's own ``priority_weight`` plus the platform's priority weight
    (:func:`hai_airflow.scheduling.weight.weight`) of the job it would submit now; tasks that
    are not hai operators, or submit low-priority jobs, keep their own ``priority_weight``.
    """

    def get_weight(self, ti: TaskInstance) -> int:
        task = ti.task
        base = int(getattr(task, "priority_weight", 1) or 0)
        max_schedule = declared_max_schedule(task)
        extra = 0 if max_schedule is None else hai_weight(max_schedule, time.time())
        return max(INT32[0], min(INT32[1], base + extra))
