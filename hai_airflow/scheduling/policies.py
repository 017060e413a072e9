"""Named scheduling strategies: queue order, victim order, and whether preemption happens."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from hai_airflow.scheduling.fairshare import FairShare
from hai_airflow.scheduling.model import Job
from hai_airflow.scheduling.weight import queue_key

SortKey = tuple[float | int, ...]


class QueueKey(Protocol):
    """A queue order: the sort key of a waiting job at `now`, given the users' recent use (or None)."""

    def __call__(self, job: Job, now: float, fair_share: FairShare | None = None, /) -> SortKey: ...


@dataclass(frozen=True, slots=True)
class Policy:
    """A strategy: how the queue is ordered, which victims go first, and who the guard protects."""

    name: str
    description: str
    queue_key: QueueKey
    victim_key: Callable[[Job, float], SortKey]
    victim_rule: str
    """The victim order in words, quoted in Suspend reasons."""
    preempts: bool
    guards_any_job: bool = False
    """Starvation guard for the first job that cannot be placed, not only the first high one."""


def run_seconds(job: Job, now: float) -> float:
    """How long the current run has lasted (started_at, else submitted_at)."""
    started = job.started_at if job.started_at is not None else job.submitted_at
    return now - started


def longest_running_first(job: Job, now: float) -> SortKey:
    """Victim order (platform document): 1. longest current run first; 2. job id."""
    return (-run_seconds(job, now), job.id)


def least_lost_work_first(job: Job, now: float) -> SortKey:
    """Victim order: 1. fewest GPU-seconds since the last checkpoint (else the start);
    2. longest current run; 3. job id."""
    since = job.last_checkpoint_at if job.last_checkpoint_at is not None else job.started_at
    if since is None:
        since = job.submitted_at
    lost = max(job.total_gpus, 1) * max(now - since, 0.0)
    return (lost, -run_seconds(job, now), job.id)


def newest_first(job: Job, now: float) -> SortKey:
    """Victim order: 1. most recently started first; 2. job id."""
    return (run_seconds(job, now), job.id)


def submit_order(job: Job, now: float, fair_share: FairShare | None = None) -> SortKey:
    """FIFO queue order: 1. submit time; 2. job id (priority and fair share ignored)."""
    return (job.submitted_at, job.id)


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy(
            name="seed",
            description="High before low, high by deadline, low by waiting plus time lost to suspension; "
            "suspends the longest-running low job that makes room (the platform document's rule).",
            queue_key=queue_key,
            victim_key=longest_running_first,
            victim_rule="the longest-running low-priority job whose suspension makes room",
            preempts=True,
        ),
        Policy(
            name="least-lost-work",
            description="Seed queue order; suspends the job that loses the fewest GPU-seconds "
            "since its last checkpoint.",
            queue_key=queue_key,
            victim_key=least_lost_work_first,
            victim_rule="the low-priority job losing the least work since its last checkpoint",
            preempts=True,
        ),
        Policy(
            name="newest-first",
            description="Seed queue order; suspends the most recently started low job.",
            queue_key=queue_key,
            victim_key=newest_first,
            victim_rule="the most recently started low-priority job that makes room",
            preempts=True,
        ),
        Policy(
            name="fifo",
            description="First come, first served: no priority, no preemption.",
            queue_key=submit_order,
            victim_key=longest_running_first,
            victim_rule="none (fifo never preempts)",
            preempts=False,
            guards_any_job=True,
        ),
    )
}
"""Strategies by name; `Snapshot.policy` picks one."""
