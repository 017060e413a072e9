"""Figures of one simulation run: throughput, utilisation, queueing, preemption cost, planner speed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hai_airflow.scheduling.weight import deadline_at
from hai_airflow.sim.engine import JobOutcome, SimRun


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) of ascending values, interpolating linearly between ranks."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def figure(description: str) -> Any:
    """A reported figure: a field known by its description (it is what `hai sim -o json` documents)."""
    return Field(description=description)


class SimSummary(BaseModel):
    """What `hai sim` reports for one policy; None where no job contributes to a figure."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str = figure("Planner policy the trace was replayed under.")
    fair_share: bool = figure("Whether low-priority jobs were ordered with the fair-share term.")
    jobs: int = figure("Jobs in the trace.")
    jobs_finished: int = figure("Jobs that ran to completion.")
    jobs_unfinished: int = figure("Jobs still waiting when nothing else could happen.")
    jobs_rejected: int = figure("Jobs the planner refused as impossible on this cluster.")
    downgraded_to_low: int = figure("High-priority requests beyond quota at submission, run as low.")
    high_jobs: int = figure("Jobs that ran as high priority.")
    makespan_s: float = figure("Seconds from the first submission to the last completion.")
    gpu_utilisation: float = figure("Allocated GPU-seconds (lost work included) / all GPUs x makespan.")
    high_queue_p50_s: float | None = figure("High priority: median seconds from submission to first start.")
    high_queue_p95_s: float | None = figure("High priority: 95th percentile queueing seconds.")
    high_queue_p99_s: float | None = figure("High priority: 99th percentile queueing seconds.")
    high_within_max_schedule: float | None = figure(
        "Share of high-priority jobs first started within their max_schedule hours."
    )
    low_queue_p50_s: float | None = figure("Low priority: median seconds from submission to first start.")
    low_queue_p95_s: float | None = figure("Low priority: 95th percentile queueing seconds.")
    low_user_median_min_s: float | None = figure(
        "Low priority, per user: the lowest of the users' median queueing seconds."
    )
    low_user_median_max_s: float | None = figure(
        "Low priority, per user: the highest of the users' median queueing seconds."
    )
    low_user_mean_jain: float | None = figure(
        "Low priority, per user: Jain's fairness index of the users' mean queueing seconds (1 = all equal, "
        "1/users = one user does all the waiting)."
    )
    jct_p50_s: float | None = figure("Median job completion time (submission to completion), seconds.")
    jct_p95_s: float | None = figure("95th percentile job completion time, seconds.")
    low_jct_p50_s: float | None = figure("Low priority: median job completion time, seconds.")
    low_jct_p90_s: float | None = figure("Low priority: 90th percentile job completion time, seconds.")
    suspensions: int = figure("Suspensions (preemptions) of low-priority jobs.")
    shrinks: int = figure("Resizable jobs shrunk to fewer workers for a high-priority job.")
    grows: int = figure("Resizable jobs grown back on free GPUs.")
    lost_gpu_hours: float = figure(
        "GPU-hours thrown away: work since the last checkpoint of suspended jobs, and the restart delay "
        "on the GPUs a resized job held."
    )
    planner_cycles: int = figure("Calls to the planner.")
    planner_ms_median: float | None = figure("Median wall-clock milliseconds per planner call.")
    planner_ms_max: float | None = figure("Slowest planner call, milliseconds.")
    wall_s: float = figure("Wall-clock seconds the simulation took.")
    jobs_per_wall_s: float = figure("Simulated jobs per wall-clock second.")


def jain(values: Sequence[float]) -> float | None:
    """Jain's fairness index, (sum x)^2 / (n sum x^2): 1 when all are equal; None without values or
    when all are 0 (nobody waited: nothing to share)."""
    squares = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * squares) if squares > 0 else None


def low_waits_by_user(run: SimRun) -> dict[str, list[float]]:
    """Each user's low-priority queueing seconds (submission to first start), ascending."""
    waits: dict[str, list[float]] = {}
    for o in run.outcomes:
        if o.rejected is None and not o.high and o.first_started_at is not None:
            waits.setdefault(o.job.user, []).append(o.first_started_at - o.job.submit_time)
    return {user: sorted(w) for user, w in waits.items()}


def _started_in_time(o: JobOutcome) -> bool:
    """A high-priority job started by its max_schedule deadline."""
    return o.first_started_at is not None and o.first_started_at <= deadline_at(
        o.job.submit_time, o.job.max_schedule
    )


def summarize(run: SimRun) -> SimSummary:
    outcomes = [o for o in run.outcomes if o.rejected is None]
    finished = [o for o in outcomes if o.finished_at is not None]
    high = [o for o in outcomes if o.high]
    high_queue = sorted(
        o.first_started_at - o.job.submit_time for o in high if o.first_started_at is not None
    )
    low_queue = sorted(
        o.first_started_at - o.job.submit_time
        for o in outcomes
        if not o.high and o.first_started_at is not None
    )
    within = sum(1 for o in high if _started_in_time(o))
    jct = sorted(o.finished_at - o.job.submit_time for o in finished if o.finished_at is not None)
    low_jct = sorted(
        o.finished_at - o.job.submit_time for o in finished if not o.high and o.finished_at is not None
    )
    first_submit = min((o.job.submit_time for o in run.outcomes), default=0.0)
    makespan = max((o.finished_at for o in finished if o.finished_at is not None), default=first_submit)
    makespan -= first_submit
    capacity = sum(n.gpus for n in run.nodes) * makespan
    cycles_ms = sorted(s * 1000 for s in run.cycle_seconds)
    by_user = low_waits_by_user(run).values()
    user_medians = [m for w in by_user if (m := percentile(w, 50)) is not None]
    return SimSummary(
        policy=run.policy,
        fair_share=run.fair_share,
        jobs=len(run.outcomes),
        jobs_finished=len(finished),
        jobs_unfinished=len(outcomes) - len(finished),
        jobs_rejected=len(run.outcomes) - len(outcomes),
        downgraded_to_low=sum(o.downgraded for o in run.outcomes),
        high_jobs=len(high),
        makespan_s=makespan,
        gpu_utilisation=sum(o.gpu_seconds for o in run.outcomes) / capacity if capacity else 0.0,
        high_queue_p50_s=percentile(high_queue, 50),
        high_queue_p95_s=percentile(high_queue, 95),
        high_queue_p99_s=percentile(high_queue, 99),
        high_within_max_schedule=within / len(high) if high else None,
        low_queue_p50_s=percentile(low_queue, 50),
        low_queue_p95_s=percentile(low_queue, 95),
        low_user_median_min_s=min(user_medians, default=None),
        low_user_median_max_s=max(user_medians, default=None),
        low_user_mean_jain=jain([sum(w) / len(w) for w in by_user]),
        jct_p50_s=percentile(jct, 50),
        jct_p95_s=percentile(jct, 95),
        low_jct_p50_s=percentile(low_jct, 50),
        low_jct_p90_s=percentile(low_jct, 90),
        suspensions=sum(o.suspensions for o in run.outcomes),
        shrinks=sum(o.shrinks for o in run.outcomes),
        grows=sum(o.grows for o in run.outcomes),
        lost_gpu_hours=sum(o.lost_gpu_seconds for o in run.outcomes) / 3600,
        planner_cycles=len(cycles_ms),
        planner_ms_median=percentile(cycles_ms, 50),
        planner_ms_max=cycles_ms[-1] if cycles_ms else None,
        wall_s=run.wall_seconds,
        jobs_per_wall_s=len(run.outcomes) / run.wall_seconds if run.wall_seconds > 0 else 0.0,
    )
