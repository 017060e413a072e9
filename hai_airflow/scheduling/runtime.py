"""How long a job will run: its time limit, else the median of recent runtimes of jobs like it."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Literal, TypeVar

K = TypeVar("K", bound=Hashable)
RuntimeSource = Literal["limit", "history", "user", "group", "cluster"]

RECENT_RUNTIMES = 20
"""Runtimes a median is taken over: the newest of each kind of job, user and group."""
DEFAULT_RUNTIME_SECONDS = 3600.0
"""What a job is expected to run on a cluster with no finished job to learn from."""
MIN_REMAINING_SECONDS = 60.0
"""A job that has run past its estimate is expected to run at least this much longer."""


@dataclass(frozen=True, slots=True)
class RuntimeFacts:
    """What the estimate of one job reads: who runs what, its time limit, and the seconds it has run
    over all its runs (a resumed job continues from its checkpoint, as its time limit counts it)."""

    job_id: int
    user: str
    group: str
    task_name: str
    time_limit_seconds: int | None = None
    seconds_run: float = 0.0


@dataclass(frozen=True, slots=True)
class FinishedRun:
    """One finished job's total runtime, as the history keeps it."""

    user: str
    group: str
    task_name: str
    seconds: float


def _newest(
    runs: Sequence[FinishedRun], key: Callable[[FinishedRun], K], keep: int
) -> dict[K, tuple[float, ...]]:
    """Per key, the runtimes of the first `keep` runs (the newest, as runs come newest first)."""
    grouped: dict[K, list[float]] = {}
    for r in runs:
        seen = grouped.setdefault(key(r), [])
        if len(seen) < keep:
            seen.append(r.seconds)
    return {k: tuple(v) for k, v in grouped.items()}


@dataclass(frozen=True, slots=True)
class RuntimeHistory:
    """Recent runtimes by user and task name, by user, by group and over the cluster, newest first."""

    by_task: Mapping[tuple[str, str], tuple[float, ...]] = field(default_factory=dict)
    by_user: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    by_group: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    cluster: tuple[float, ...] = ()

    @classmethod
    def of(cls, runs: Sequence[FinishedRun], keep: int = RECENT_RUNTIMES) -> RuntimeHistory:
        """The history of finished runs given newest first, keeping the newest `keep` of each kind."""
        return cls(
            by_task=_newest(runs, lambda r: (r.user, r.task_name), keep),
            by_user=_newest(runs, lambda r: r.user, keep),
            by_group=_newest(runs, lambda r: r.group, keep),
            cluster=tuple(r.seconds for r in runs[:keep]),
        )


@dataclass(frozen=True, slots=True)
class RuntimeEstimate:
    """A job's expected total runtime, what is left of it, and where the figure comes from."""

    seconds: float
    remaining: float
    source: RuntimeSource


def _median(runtimes: Sequence[float]) -> float | None:
    return float(median(runtimes)) if runtimes else None


def total_runtime(facts: RuntimeFacts, history: RuntimeHistory) -> tuple[float, RuntimeSource]:
    """The job's total runtime, in order of evidence:

    1. its time limit (an upper bound: it cannot run longer);
    2. the median of the same user's recent runs of the same task name;
    3. of the user's recent runs;
    4. of the group's;
    5. of the cluster's (DEFAULT_RUNTIME_SECONDS while nothing has finished).
    """
    if facts.time_limit_seconds is not None:
        return float(facts.time_limit_seconds), "limit"
    levels: tuple[tuple[Sequence[float], RuntimeSource], ...] = (
        (history.by_task.get((facts.user, facts.task_name), ()), "history"),
        (history.by_user.get(facts.user, ()), "user"),
        (history.by_group.get(facts.group, ()), "group"),
    )
    for runtimes, source in levels:
        seconds = _median(runtimes)
        if seconds is not None:
            return seconds, source
    return _median(history.cluster) or DEFAULT_RUNTIME_SECONDS, "cluster"


def estimate_runtime(facts: RuntimeFacts, history: RuntimeHistory) -> RuntimeEstimate:
    """The job's runtime and what is left of it after the seconds it has run: past a median, at least
    MIN_REMAINING_SECONDS more; past its time limit, nothing (it is being stopped)."""
    seconds, source = total_runtime(facts, history)
    left = seconds - facts.seconds_run
    floor = 0.0 if source == "limit" else MIN_REMAINING_SECONDS
    return RuntimeEstimate(seconds, max(left, floor), source)
