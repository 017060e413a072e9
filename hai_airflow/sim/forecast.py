"""When each queued job will start: the platform's planner run forward on a copy of the cluster, with
every job running for its estimated time."""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from hai_airflow.scheduling import plan
from hai_airflow.scheduling.model import (
    PLACED,
    WAITING,
    Admit,
    Decision,
    Grow,
    Placement,
    Reject,
    Reservation,
    Reserve,
    Shrink,
    Snapshot,
    Suspend,
    Wait,
)
from hai_airflow.scheduling.resize import resizing
from hai_airflow.scheduling.state import ClusterState
from hai_airflow.spec import JobState

STEP_SECONDS = 120.0
"""Simulated time between two forward plans at least: job ends closer than this are planned together."""
STEP_SHARE = 0.5
"""Further out, a step is this share of the time simulated so far, so the number of plans grows with
the log of the horizon rather than with the number of job ends (a plan over a long queue costs tens of
milliseconds). A start is forecast at the last end of its step: it is late by less than the step."""
REPLANS_AT_ONCE = 3
"""Plans at one instant after suspensions, before the clock moves on anyway."""


@dataclass(frozen=True, slots=True)
class Forecast:
    """Predicted starts of queued jobs (and suspensions of running ones), as of `at`.

    A queued job missing from `starts` did not start before `horizon`: the forward run stopped there
    (its time budget spent, or nothing more could start).
    """

    at: float
    starts: Mapping[int, float] = field(default_factory=dict)
    freed_by: Mapping[int, int] = field(default_factory=dict)
    """Per start after `at`, the job whose estimated end the clock had moved to (it made the room)."""
    suspensions: Mapping[int, float] = field(default_factory=dict)
    """Running low jobs the forward run suspended before their estimated end, and when."""
    horizon: float = 0.0
    complete: bool = True
    """Every queued job got a start, or could never get one; False when the budget ran out first."""
    cycles: int = 0


@dataclass(slots=True)
class _Run:
    """The forward run's own bookkeeping beside the copied cluster state."""

    state: ClusterState
    left: dict[int, float]
    """Seconds of work left per job at the start of its current run (or while it waits)."""
    began: dict[int, float] = field(default_factory=dict)
    ends: list[tuple[float, int, int]] = field(default_factory=list)
    """(end, job id, generation): when each running job ends unless suspended first."""
    generation: dict[int, int] = field(default_factory=dict)
    starts: dict[int, float] = field(default_factory=dict)
    freed_by: dict[int, int] = field(default_factory=dict)
    suspensions: dict[int, float] = field(default_factory=dict)
    running_low: frozenset[int] = frozenset()
    last_ended: int | None = None
    """The job whose end the clock moved to last (None at the start)."""

    def run(self, job_id: int, now: float) -> None:
        self.began[job_id] = now
        heapq.heappush(self.ends, (now + self.left.get(job_id, 0.0), job_id, self.generation.get(job_id, 0)))

    def apply(self, decision: Decision, now: float) -> None:
        """Apply one decision to the copy."""
        state = self.state
        if isinstance(decision, Admit):
            job = state.jobs[decision.job_id]
            placed = replace(job, state=JobState.RUNNING, started_at=now, placement=decision.placement,
                             suspended_at=None)
            state.job_changed(placed)
            state.reservation_cleared(job.id)
            if job.id not in self.starts:
                self.starts[job.id] = now
                if self.last_ended is not None:
                    self.freed_by[job.id] = self.last_ended
            self.run(job.id, now)
        elif isinstance(decision, Suspend):
            self.suspend(decision.job_id, now)
        elif isinstance(decision, Shrink | Grow):
            self.resize(decision.job_id, decision.to, decision.placement, now)
        elif isinstance(decision, Reserve):
            held = (Reservation(decision.job_id, w.node, w.gpus) for w in decision.placement)
            state.reserved(decision.job_id, held)
        elif isinstance(decision, Reject):
            state.job_left(decision.job_id)
            state.reservation_cleared(decision.job_id)

    def suspend(self, job_id: int, now: float) -> None:
        """The job waits again at once, keeping the work it did (as if it had just checkpointed).

        One stopping to restart at a new size (`resizing`) is not a suspension: it waits for its
        reserved GPUs, its work left stretched (or shrunk) to its new size."""
        job = self.state.jobs[job_id]
        left = max(self.left.get(job_id, 0.0) - (now - self.began.get(job_id, now)), 0.0)
        restarting = resizing(job)
        self.left[job_id] = left * len(job.placement) / job.workers if restarting else left
        self.generation[job_id] = self.generation.get(job_id, 0) + 1
        self.state.job_changed(replace(job, state=JobState.SUSPENDED, started_at=None, placement=(),
                                       suspended_at=now, preemptions=job.preemptions + 1))
        if job_id in self.running_low and not restarting:
            self.suspensions.setdefault(job_id, now)

    def resize(self, job_id: int, to: int, placement: Placement, now: float) -> None:
        """The job restarts at once at `to` workers on `placement`; the work it has left takes
        proportionally longer (or shorter) at its new size."""
        job = self.state.jobs[job_id]
        left = max(self.left.get(job_id, 0.0) - (now - self.began.get(job_id, now)), 0.0)
        self.left[job_id] = left * job.workers / to
        self.generation[job_id] = self.generation.get(job_id, 0) + 1
        self.state.job_changed(replace(job, workers=to, placement=placement, started_at=now))
        self.state.reservation_cleared(job_id)
        self.run(job_id, now)

    def end_until(self, until: float) -> float:
        """Jobs whose estimated end is at or before `until` leave the copy; the last of those ends
        (what is freed is free from then), or `until` when none was still running."""
        last = until
        while self.ends and self.ends[0][0] <= until:
            end, job_id, generation = heapq.heappop(self.ends)
            if self.generation.get(job_id, 0) == generation and job_id in self.state.jobs:
                self.state.job_left(job_id)
                self.state.reservation_cleared(job_id)
                last, self.last_ended = end, job_id
        return last


def _start(snapshot: Snapshot, remaining: Mapping[int, float], now: float) -> _Run:
    """The copy: placed jobs run their remaining time from `now`; jobs being suspended wait again."""
    state = ClusterState.load(snapshot.nodes, snapshot.jobs, snapshot.reservations, snapshot.quota,
                              snapshot.policy)
    low = frozenset(j.id for j in snapshot.jobs if j.state in PLACED and not j.high)
    forward = _Run(state, {j.id: remaining.get(j.id, 0.0) for j in snapshot.jobs}, running_low=low)
    for job in snapshot.jobs:
        if job.state == JobState.SUSPENDING:
            forward.suspend(job.id, now)
        elif job.state in PLACED:
            forward.run(job.id, now)
    return forward


def forecast(
    snapshot: Snapshot,
    remaining: Mapping[int, float],
    now: float,
    budget_seconds: float | None = None,
    step_seconds: float = STEP_SECONDS,
    clock: Callable[[], float] = time.perf_counter,
) -> Forecast:
    """Plan forward from `now` until every waiting job has started, nothing more can start, or
    `budget_seconds` of `clock` are spent.

    1. copy the snapshot into a fresh cluster state (the snapshot is not modified);
    2. plan over the copy and apply the decisions: admitted jobs run their `remaining` seconds,
       suspended ones wait again with the work they did;
    3. end the jobs due by the next estimated end, or by a step on (`step_seconds`, or STEP_SHARE
       of the time simulated so far, whichever is longer), and move the clock to the last of those
       ends; after suspensions, plan again at once instead (as the controller does); repeat.
    """
    deadline = None if budget_seconds is None else clock() + budget_seconds
    forward = _start(snapshot, remaining, now)
    t, cycles, again = now, 0, 0
    while any(j.state in WAITING for j in forward.state.jobs.values()):
        if deadline is not None and clock() >= deadline:
            return _result(forward, now, t, cycles, complete=False)
        decisions = plan(forward.state.snapshot(), t, forward.state.usage)
        cycles += 1
        acts = [d for d in decisions if type(d) is not Wait]  # most of a long queue only waits
        for d in acts:
            forward.apply(d, t)
        if any(isinstance(d, Suspend | Shrink) for d in acts) and again < REPLANS_AT_ONCE:
            again += 1
            continue  # the victims have left: their preemptors start in the next plan
        if not forward.ends:
            break  # nothing runs and nothing more starts: the rest can never start here
        step = max(step_seconds, (t - now) * STEP_SHARE)
        t, again = forward.end_until(max(forward.ends[0][0], t + step)), 0
    return _result(forward, now, t, cycles, complete=True)


def _result(forward: _Run, now: float, horizon: float, cycles: int, complete: bool) -> Forecast:
    return Forecast(at=now, starts=dict(forward.starts), freed_by=dict(forward.freed_by),
                    suspensions=dict(forward.suspensions), horizon=horizon, complete=complete, cycles=cycles)
