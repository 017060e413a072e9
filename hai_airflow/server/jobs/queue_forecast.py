"""One forecast of the queue: runtime estimates for every unfinished job, then the planner run forward
on a copy of the cluster (`sim.forecast`); what the API shows of it per job."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from hai_airflow.scheduling.model import Decision, Snapshot
from hai_airflow.scheduling.runtime import RuntimeEstimate, RuntimeFacts, RuntimeHistory, estimate_runtime
from hai_airflow.server.jobs.kept import KeptInstance, KeptJob
from hai_airflow.server.jobs.views import when
from hai_airflow.sim.forecast import forecast
from hai_airflow.spec import WAITING, ForecastSource, ForecastView


@dataclass(frozen=True, slots=True)
class Offer:
    """What the controller planned last: its snapshot and shallow copies of its maps of records (all
    immutable: the controller replaces a record, it never changes one)."""

    snapshot: Snapshot
    rows: Mapping[int, KeptJob]
    current: Mapping[int, KeptInstance]
    at: float
    decisions: Sequence[Decision] | None = ()
    """The plan made over `snapshot`: a forecast is needed only where it left a job waiting; None when
    the controller did not plan, because the only change was new jobs that wait anyway."""


@dataclass(frozen=True, slots=True)
class JobForecast:
    """When a queued job is expected to start (None: not within the forecast's horizon) and from which
    runtime estimate; for a running low job, when it is expected to be suspended before its end."""

    start_at: float | None = None
    source: ForecastSource | None = None
    suspension_at: float | None = None
    end_at: float | None = None
    source_owner: tuple[str, str] | None = None
    """The user and group of the job whose estimated end makes room for this start (None: at once):
    a start that rests on a job the caller may not see is shown without its source, to the grain."""


GRAIN_SECONDS = 900.0
"""A start that rests on another user's job is shown rounded up to a quarter-hour, without its source:
else its exact time and `source: limit` would tell that job's private time limit."""


def coarse(at: float | None) -> float | None:
    """`at` rounded up to the next GRAIN_SECONDS of the clock."""
    return None if at is None else math.ceil(at / GRAIN_SECONDS) * GRAIN_SECONDS


@dataclass(frozen=True, slots=True)
class QueueForecast:
    """Every unfinished job's forecast as of `at`; `horizon` is how far the forward run reached."""

    at: float
    jobs: Mapping[int, JobForecast] = field(default_factory=dict)
    horizon: float = 0.0
    complete: bool = True
    seconds: float = 0.0
    """Wall-clock seconds the forecast took."""

    def view(self, job_id: int, full: bool, sees: Callable[[str, str], bool]) -> ForecastView | None:
        """The job's forecast as the API shows it to a caller who `sees(user, group)`'s jobs; `full`
        False (another user's job): the time only. A start resting on a job the caller may not see
        comes without its source, rounded up to GRAIN_SECONDS."""
        f = self.jobs.get(job_id)
        if f is None:
            return None
        hidden = f.source_owner is not None and not sees(*f.source_owner)
        start, source = (coarse(f.start_at), None) if hidden else (f.start_at, f.source)
        if not full:
            return ForecastView(start_at=when(start), horizon=when(self.horizon), at=when(self.at))
        return ForecastView(
            start_at=when(start),
            source=source,
            suspension_at=when(f.suspension_at),
            end_at=when(f.end_at),
            horizon=when(self.horizon),
            at=when(self.at),
        )


def forecast_queue(
    snapshot: Snapshot,
    facts: Mapping[int, RuntimeFacts],
    history: RuntimeHistory,
    now: float,
    budget_seconds: float | None,
) -> QueueForecast:
    """Estimate every job's runtime, run the planner forward and name, for each start, the runtime
    estimate of the job whose end made room for it (`limit` is an upper bound: the start is then at the
    latest; a start at once has the source of nothing and says `now`)."""
    estimates = {job_id: estimate_runtime(f, history) for job_id, f in facts.items()}
    remaining = {job_id: e.remaining for job_id, e in estimates.items()}
    run = forecast(snapshot, remaining, now, budget_seconds)
    waiting = {j.id for j in snapshot.jobs if j.state in WAITING}
    owners = {j.id: (j.user, j.group) for j in snapshot.jobs}
    jobs: dict[int, JobForecast] = {}
    for job in snapshot.jobs:
        if job.id in waiting:
            jobs[job.id] = _start(run.starts.get(job.id), run.freed_by.get(job.id), estimates, owners)
        else:
            end = now + remaining[job.id] if job.id in remaining else None
            source = estimates[job.id].source if job.id in estimates else None
            jobs[job.id] = JobForecast(None, source, run.suspensions.get(job.id), end)
    return QueueForecast(now, jobs, run.horizon, run.complete)


def _start(
    at: float | None,
    freed_by: int | None,
    estimates: Mapping[int, RuntimeEstimate],
    owners: Mapping[int, tuple[str, str]],
) -> JobForecast:
    if at is None:
        return JobForecast()
    if freed_by is None or freed_by not in estimates:
        return JobForecast(at, "now")
    return JobForecast(at, estimates[freed_by].source, source_owner=owners.get(freed_by, ("", "")))
