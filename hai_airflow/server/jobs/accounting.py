"""Accounting, as `sacct`/`sreport` give it: per user or group over a window, the jobs submitted and
ended, GPU-hours run (high and low), GPU-hours lost to preemption, and how long jobs waited to start.

Pure: records in, rows out; `routes/accounting.py` reads the records. The rules, once:

- a run's GPU-hours are its GPUs times the part of its run inside the window (a run still going counts
  up to `until`);
- a run's loss counts in the window it ended in (what it ran past its job's latest checkpoint before a
  preemption or an admin's suspension took it off its GPUs: `InstanceRow.lost_gpu_seconds`);
- a job is counted where it was submitted, its end state where it ended, its wait (first start minus
  submit) where it first started.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from hai_airflow.spec import TERMINAL_STATES, JobState

HOUR = 3600.0


@dataclass(frozen=True)
class Run:
    """One instance of a job, as accounting needs it."""

    user: str
    group: str
    high: bool
    gpus: int
    started_at: float
    ended_at: float | None
    lost_gpu_seconds: float = 0.0


@dataclass(frozen=True)
class JobRecord:
    """One job, as accounting needs it."""

    user: str
    group: str
    submitted_at: float
    first_started_at: float | None
    ended_at: float | None
    state: JobState


@dataclass
class Account:
    """One row of the report: a user's or a group's."""

    name: str
    jobs: int = 0
    ended: dict[str, int] = field(default_factory=dict)
    high_gpu_hours: float = 0.0
    low_gpu_hours: float = 0.0
    lost_gpu_hours: float = 0.0
    waits: list[float] = field(default_factory=list)

    @property
    def gpu_hours(self) -> float:
        return self.high_gpu_hours + self.low_gpu_hours

    def wait_percentile(self, p: float) -> float | None:
        return percentile(self.waits, p)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank percentile (`p` in 0..100): a value that occurred; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def overlap(start: float, end: float, since: float, until: float) -> float:
    """Seconds of [start, end) inside [since, until)."""
    return max(0.0, min(end, until) - max(start, since))


def within(at: float | None, since: float, until: float) -> bool:
    return at is not None and since <= at < until


def report(
    jobs: Iterable[JobRecord], runs: Iterable[Run], since: float, until: float, by: Callable[[str, str], str]
) -> list[Account]:
    """The accounts over [since, until), one per name `by(user, group)` gives, sorted by name."""
    accounts: dict[str, Account] = {}

    def account(user: str, group: str) -> Account:
        name = by(user, group)
        return accounts.setdefault(name, Account(name))

    for job in jobs:
        row = account(job.user, job.group)
        if within(job.submitted_at, since, until):
            row.jobs += 1
        if job.state in TERMINAL_STATES and within(job.ended_at, since, until):
            row.ended[job.state] = row.ended.get(job.state, 0) + 1
        if job.first_started_at is not None and within(job.first_started_at, since, until):
            row.waits.append(max(0.0, job.first_started_at - job.submitted_at))
    for run in runs:
        row = account(run.user, run.group)
        hours = run.gpus * overlap(run.started_at, run.ended_at or until, since, until) / HOUR
        if run.high:
            row.high_gpu_hours += hours
        else:
            row.low_gpu_hours += hours
        if within(run.ended_at, since, until):
            row.lost_gpu_hours += run.lost_gpu_seconds / HOUR
    return [accounts[name] for name in sorted(accounts)]


DAY = 86400.0


def days(since: float, until: float) -> list[float]:
    """The starts of the UTC days that [since, until) touches."""
    first = since - since % DAY
    return [first + i * DAY for i in range(math.ceil((until - first) / DAY))]


def daily_gpu_hours(
    runs: Sequence[Run], since: float, until: float, by: Callable[[str, str], str]
) -> dict[str, list[float]]:
    """GPU-hours per name and UTC day of [since, until) (one value per `days(since, until)`): each run
    adds to the days it ran on, so the cost is the runs' days, not the window's days times the runs."""
    starts = days(since, until)
    series: dict[str, list[float]] = {}
    for run in runs:
        row = series.setdefault(by(run.user, run.group), [0.0] * len(starts))
        begin, end = max(run.started_at, since), min(run.ended_at or until, until)
        i = max(0, int((begin - starts[0]) // DAY))
        while i < len(starts) and starts[i] < end:
            row[i] += run.gpus * overlap(begin, end, starts[i], starts[i] + DAY) / HOUR
            i += 1
    return dict(sorted(series.items()))


def waiting_at(jobs: Sequence[JobRecord], moments: Sequence[float]) -> list[int]:
    """How many jobs waited for their first start at each moment (submitted, neither started nor ended):
    those submitted by then less those that left the queue by then."""
    came = sorted(j.submitted_at for j in jobs)
    left = sorted(
        min(t for t in (j.first_started_at, j.ended_at) if t is not None)
        for j in jobs
        if j.first_started_at is not None or j.ended_at is not None
    )
    return [bisect_right(came, t) - bisect_right(left, t) for t in moments]
