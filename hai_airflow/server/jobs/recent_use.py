"""The users' recent use, read from the store for the fair-share term of the low-priority weight."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import Integer, Select, case, cast, func, select
from sqlalchemy.orm import Session

from hai_airflow.scheduling.fairshare import (
    CPU_CORES_PER_GPU,
    MEASURE_SECONDS,
    WINDOW_SECONDS,
    FairShare,
    decayed,
)
from hai_airflow.scheduling.state import ClusterState
from hai_airflow.server.store.database import Store
from hai_airflow.server.store.tables import InstanceRow, JobRow

FAIR_SHARE_ON = True
"""Whether the controller measures the users' recent use, so that low jobs are ordered with the
fair-share term; False: by waiting time (and time lost to suspension) alone."""

BUCKET_SECONDS = 3600.0
"""Runs are summed per user and hour of their middle, each hour's sum decayed as one: a week's half-life
moves by a fraction of a percent within an hour, and the answer is users x hours rows, not runs."""


def _runs(since: float, now: float, ended: bool) -> Select[str, int, Any]:
    """Per user and hour: the charged GPU-seconds of the instances that ended since `since` (or, with
    `ended` false, that still run), counted from `since` at the earliest. GPUs as `hai usage` counts
    them (the instance's, else the job's); a CPU job's cores / CPU_CORES_PER_GPU."""
    gpus = func.coalesce(InstanceRow.gpus, JobRow.workers * JobRow.gpus_per_worker)
    rate = case((gpus > 0, gpus), else_=JobRow.workers * JobRow.cpus_per_worker / CPU_CORES_PER_GPU)
    start = case((InstanceRow.started_at < since, since), else_=InstanceRow.started_at)
    end = InstanceRow.ended_at if ended else now
    hour = cast((start + end) / (2 * BUCKET_SECONDS), Integer)
    return (
        select(JobRow.user_name, hour, func.sum(rate * (end - start)))
        .join(JobRow, JobRow.id == InstanceRow.job_id)
        .where(InstanceRow.started_at.is_not(None))
        .where(InstanceRow.ended_at > since if ended else InstanceRow.ended_at.is_(None))
        .group_by(JobRow.user_name, hour)
    )


def recent_use(session: Session, now: float) -> FairShare:
    """Each user's use of the last `fairshare.WINDOW_SECONDS`, decayed to `now`: two bounded queries
    (the ended runs by the instances' end index, and the running ones), summed per user and hour."""
    since = now - WINDOW_SECONDS
    use: dict[str, float] = {}
    for ended in (True, False):
        for user, hour, seconds in session.execute(_runs(since, now, ended)):
            middle = min((hour + 0.5) * BUCKET_SECONDS, now)
            use[user] = use.get(user, 0.0) + decayed(float(seconds or 0.0), middle, now)
    return FairShare(use)


class UseMeter:
    """Hands the cluster state the users' recent use, read again at most every MEASURE_SECONDS."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.measured: FairShare | None = None
        self.at = -math.inf

    def measure(self, state: ClusterState, now: float) -> None:
        """Give `state` the latest figures (a state read whole anew has none), reading them if due."""
        if not FAIR_SHARE_ON:
            return
        if now - self.at >= MEASURE_SECONDS:
            with self.store.read() as s:
                self.measured = recent_use(s, now)
            self.at = now
        state.use_measured(self.measured)
