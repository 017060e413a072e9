"""When a queued job should start, where that can be known: one estimate for the dashboard and `hai queue`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import TypeAdapter, ValidationError

from hai_airflow.scheduling.weight import deadline_at
from hai_airflow.spec import JobDetailView, JobSpec, JobState, QueueEntryView, is_high

_SPEC: TypeAdapter[JobSpec] = TypeAdapter(JobSpec)


@dataclass(frozen=True)
class StartEstimate:
    """A queued job's expected start: `now`, after a victim's grace period, by its max_schedule
    promise, as forecast, or `unknown`; `note` says where it comes from, `source` which runtime
    estimate a forecast rests on (None where the caller may not see it)."""

    kind: Literal["now", "grace", "promise", "forecast", "unknown"]
    at: datetime | None
    note: str
    source: str | None = None


def grace_seconds(job: JobDetailView) -> int:
    """The job's grace period between the save notice and the kill; 0 if its spec cannot be read."""
    try:
        return _SPEC.validate_python(job.spec).effective_grace_seconds
    except ValidationError:
        return 0


def blocker_free_at(blocker: JobDetailView) -> datetime | None:
    """A job that is being suspended frees its GPUs at the latest when its grace period ends."""
    if blocker.state != JobState.SUSPENDING:
        return None
    asked = [e.at for e in blocker.events if e.kind == "suspending"]
    return max(asked) + timedelta(seconds=grace_seconds(blocker)) if asked else None


def start_estimate(entry: QueueEntryView, blocker: JobDetailView | None) -> StartEstimate:
    """When the job should start, in order of certainty.

    1. admitted in the current scheduling cycle: now;
    2. waiting behind a job being suspended (`blocker`, when the caller may see it): when that
       job's grace period ends;
    3. high priority: its max_schedule promise (submitted_at + max_schedule hours);
    4. the forecast (the planner run forward with estimated runtimes), when it reached the job;
    5. otherwise unknown: it depends on when running jobs end.
    """
    if entry.reason.startswith("starting"):
        return StartEstimate("now", None, "admitted in the current scheduling cycle")
    free_at = blocker_free_at(blocker) if blocker is not None else None
    if free_at is not None and blocker is not None:
        return StartEstimate("grace", free_at, f"when job {blocker.id} has been suspended (grace period)")
    if is_high(entry.job.max_schedule):
        promised = deadline_at(entry.job.submitted_at.timestamp(), entry.job.max_schedule)
        target = datetime.fromtimestamp(promised, tz=entry.job.submitted_at.tzinfo or UTC)
        return StartEstimate("promise", target, f"max_schedule {entry.job.max_schedule} h")
    forecast = entry.forecast
    if forecast is not None and forecast.start_at is not None:
        note = "forecast with estimated runtimes"
        return StartEstimate("forecast", forecast.start_at, note, forecast.source)
    return StartEstimate("unknown", None, "depends on when running jobs end")
