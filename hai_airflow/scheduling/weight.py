"""The priority weight: the queue and resume order of waiting jobs (the "seed" policy)."""

from __future__ import annotations

from dataclasses import dataclass

from hai_airflow.scheduling.fairshare import FAIR_SHARE_SECONDS, HALF_LIFE_SECONDS, FairShare
from hai_airflow.scheduling.model import Job
from hai_airflow.spec import JobState

HIGH_BASE = 1e9
"""Added to every high-priority score so any high job outranks any low one (fits Airflow's int32)."""

LOST_WORK_FACTOR = 2.0
"""Each second a job already spent suspended counts this many seconds of waiting."""


@dataclass(frozen=True, slots=True)
class WeightTerm:
    """One named contribution to a job's weight, with a note saying where it comes from."""

    name: str
    value: float
    note: str


@dataclass(frozen=True, slots=True)
class Weight:
    """A job's priority weight: `score` (higher runs first), `sort_key` (ascending = queue order)."""

    score: float
    sort_key: tuple[float | int, ...]
    terms: tuple[WeightTerm, ...]


def deadline_at(submitted_at: float, max_schedule: int) -> float:
    """The promised latest start of a high job: submitted_at + max_schedule hours."""
    return submitted_at + max_schedule * 3600.0


def deadline(job: Job) -> float:
    """A high job's deadline: submitted_at + max_schedule hours (its promised queueing time)."""
    return deadline_at(job.submitted_at, job.max_schedule)


def lost_seconds(job: Job, now: float) -> float:
    """Time lost to suspension: past suspensions plus the ongoing one of a SUSPENDED job."""
    if job.state != JobState.SUSPENDED or job.suspended_at is None or job.suspended_at >= now:
        return job.suspended_seconds  # the common case, once per queued job per plan: no max()
    return job.suspended_seconds + (now - job.suspended_at)


def queue_key(job: Job, now: float, fair_share: FairShare | None = None) -> tuple[float | int, ...]:
    """Seed queue order, ascending.

    1. high priority before low;
    2. high: earliest deadline first (submitted_at + max_schedule * 3600);
    3. low: highest `(now - submitted_at) + LOST_WORK_FACTOR * lost_seconds + fair-share term` first,
       so a job that was suspended resumes before newer work, and a user who used less recently goes
       ahead of one who used more (`FairShare.term`; no term without `fair_share`);
    4. tie-break: job id.
    """
    if job.high:
        return (0, deadline(job), job.id)
    waited = now - job.submitted_at + LOST_WORK_FACTOR * lost_seconds(job, now)
    if fair_share is not None:
        waited += fair_share.term(job.user)
    return (1, -waited, job.id)


def weight(job: Job, now: float, fair_share: FairShare | None = None) -> Weight:
    """The job's weight with its terms; `sort_key` is `queue_key` (the one definition of the order).

    score = HIGH_BASE + (now - deadline)                          for high priority (later = more urgent)
    score = (now - submitted_at) + LOST_WORK_FACTOR * lost_seconds for low priority,
            + FAIR_SHARE_SECONDS x the owner's fair-share factor   when `fair_share` is given
    """
    key = queue_key(job, now, fair_share)
    waited = now - job.submitted_at
    terms: tuple[WeightTerm, ...]
    if job.high:
        overdue = now - deadline(job)
        terms = (
            WeightTerm("priority class", HIGH_BASE, "high priority (max_schedule > 0)"),
            WeightTerm("deadline", overdue, f"seconds past the {job.max_schedule} h max_schedule deadline"),
        )
    else:
        lost = lost_seconds(job, now)
        terms = (
            WeightTerm("priority class", 0.0, "low priority (max_schedule = 0)"),
            WeightTerm("waiting", waited, "seconds since submission"),
            WeightTerm(
                "lost to suspension",
                LOST_WORK_FACTOR * lost,
                f"{LOST_WORK_FACTOR:g} x {lost:g} seconds spent suspended",
            ),
        )
        if fair_share is not None:
            terms += (fair_share_term(job.user, fair_share),)
    return Weight(score=sum(t.value for t in terms), sort_key=key, terms=terms)


def fair_share_term(user: str, fair_share: FairShare) -> WeightTerm:
    """The fair-share term of a low job of `user`, with its factor in words (not the use itself: others
    see the term of every queued job)."""
    factor = fair_share.factor(user)
    return WeightTerm(
        "fair share",
        fair_share.term(user),
        f"{FAIR_SHARE_SECONDS:g} x factor {factor:.3f} from the owner's recent use "
        f"(1 = none, 0.5 = the mean user's; halved every {HALF_LIFE_SECONDS / 86400:g} days)",
    )
