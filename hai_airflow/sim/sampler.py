"""Forecasts made during a replay: the server's forecaster asked, every few simulated minutes, when each
queued job will start, beside the slurm-style baseline; then checked against the real starts."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hai_airflow.scheduling.model import Snapshot
from hai_airflow.scheduling.runtime import FinishedRun, RuntimeFacts, RuntimeHistory, estimate_runtime
from hai_airflow.sim.accuracy import Method, StartForecast
from hai_airflow.sim.engine import JobOutcome, SimRun, Simulator
from hai_airflow.sim.forecast import forecast
from hai_airflow.sim.trace import Trace, TraceJob
from hai_airflow.spec import JobState

DEFAULT_EVERY_SECONDS = 600.0
"""Simulated seconds between two forecasts at least; each gives every queued job its forecast."""
DEFAULT_TIME_LIMIT_SECONDS = 86_400.0
"""The slurm-style baseline's limit for a job whose trace gives none: a day, a common partition limit
(and the longest job of the synthetic benchmark trace)."""
DEFAULT_BUDGET_SECONDS = 30.0
"""Wall-clock seconds one forward run may take; past it, the jobs not yet reached get no start."""


@dataclass(frozen=True, slots=True)
class _Made:
    """The two predictions made for one queued job at one sample time."""

    job_id: int
    made_at: float
    forecast: float | None
    slurm_style: float | None


@dataclass(frozen=True, slots=True)
class ForecastRun:
    """A replay with its forecasts, each paired with the job's real first start."""

    run: SimRun
    forecasts: Mapping[Method, tuple[StartForecast, ...]]
    forward_runs: int
    """Forward runs made (two per sample: the forecast and the slurm-style baseline)."""
    incomplete: int
    """Forward runs stopped by their time budget (their figures then depend on the machine's speed)."""
    forward_seconds: float


@dataclass(slots=True)
class _Learned:
    """The finished runs seen so far, as the server's history holds them (newest last)."""

    seen: int = 0
    open: dict[int, JobOutcome] = field(default_factory=dict)
    runs: list[FinishedRun] = field(default_factory=list)
    history: RuntimeHistory = field(default_factory=RuntimeHistory)

    def update(self, outcomes: Sequence[JobOutcome]) -> RuntimeHistory:
        """Take in the jobs that finished since the last call and return the history as it stands."""
        for out in outcomes[self.seen:]:
            self.open[out.job.id] = out
        self.seen = len(outcomes)
        ended = [o for o in self.open.values() if o.finished_at is not None or o.rejected is not None]
        for out in ended:
            del self.open[out.job.id]
        done = sorted((o for o in ended if o.finished_at is not None),
                      key=lambda o: (o.finished_at or 0.0, o.job.id))
        if done:
            self.runs += [FinishedRun(o.job.user, o.job.group, o.job.task_name, o.run_seconds) for o in done]
            self.history = RuntimeHistory.of(self.runs[::-1])
        return self.history


class ForecastSampler:
    """Watches a replay through the engine's `before` hook and makes the forecasts.

    The state is unchanged between two event times, so forecasts due in between are made on it with
    their own `now`: the first when a job is queued (or `every` seconds after the previous forecast,
    if later), then every `every` seconds while any job is queued; one forward run covers every queued
    job, so the cost follows simulated time, not the number of jobs.
    """

    def __init__(self, trace: Trace, every: float, default_limit: float, budget: float | None):
        self.jobs: dict[int, TraceJob] = {j.id: j for j in trace.jobs}
        self.every = every
        self.default_limit = default_limit
        self.budget = budget
        self.made: list[_Made] = []
        self.forward_runs = 0
        self.incomplete = 0
        self.forward_seconds = 0.0
        self._learned = _Learned()
        self._previous: float | None = None
        self._last = float("-inf")

    def before(self, sim: Simulator, now: float) -> None:
        """Make the forecasts due from the previous event time up to (not including) `now`."""
        since, self._previous = self._previous, now
        if since is None:
            return
        at = max(since, self._last + self.every)
        if at >= now:
            return  # none due: spare the snapshot
        snapshot = sim.snapshot()
        queued = [j.id for j in snapshot.jobs if j.state == JobState.PENDING]
        while queued and at < now:
            self._sample(sim, snapshot, queued, at)
            self._last, at = at, at + self.every

    def _sample(self, sim: Simulator, snapshot: Snapshot, queued: list[int], at: float) -> None:
        history = self._learned.update(sim.outcomes)
        estimated = self._forward(sim, snapshot, history, at, None)
        limited = self._forward(sim, snapshot, history, at, self.default_limit)
        self.made += [_Made(i, at, estimated.get(i), limited.get(i)) for i in queued]

    def _forward(
        self,
        sim: Simulator,
        snapshot: Snapshot,
        history: RuntimeHistory,
        at: float,
        default_limit: float | None,
    ) -> Mapping[int, float]:
        """One forward run; with `default_limit`, every job runs to its time limit (this one if it has
        none)."""
        remaining: dict[int, float] = {}
        for job in snapshot.jobs:
            spec = self.jobs[job.id]
            limit = spec.time_limit if spec.time_limit is not None else default_limit
            facts = RuntimeFacts(job.id, job.user, job.group, spec.task_name,
                                 None if limit is None else round(limit), sim.seconds_run(job.id, at))
            remaining[job.id] = estimate_runtime(facts, history).remaining
        began = time.perf_counter()
        result = forecast(snapshot, remaining, at, self.budget)
        self.forward_seconds += time.perf_counter() - began
        self.forward_runs += 1
        self.incomplete += not result.complete
        return result.starts

    def result(self, run: SimRun) -> ForecastRun:
        """Pair every forecast of a job that did start with its real first start."""
        outcomes = {o.job.id: o for o in run.outcomes}
        started = [(m, outcomes[m.job_id]) for m in self.made]
        predictions: dict[Method, Callable[[_Made], float | None]] = {
            "forecast": lambda m: m.forecast,
            "slurm-style": lambda m: m.slurm_style,
            "unknown": lambda m: None,
        }
        by_method = {
            method: tuple(StartForecast(m.job_id, out.high, m.made_at, predicted(m), out.first_started_at)
                          for m, out in started if out.first_started_at is not None)
            for method, predicted in predictions.items()
        }
        return ForecastRun(run, by_method, self.forward_runs, self.incomplete, self.forward_seconds)


def replay_with_forecasts(
    trace: Trace,
    policy: str,
    every: float = DEFAULT_EVERY_SECONDS,
    default_limit: float = DEFAULT_TIME_LIMIT_SECONDS,
    budget: float | None = DEFAULT_BUDGET_SECONDS,
    **replay: Any,
) -> ForecastRun:
    """Replay `trace` as `simulate` does (`replay`: the Simulator's other arguments, e.g.
    `checkpoint_interval`, `cycle_interval`, `progress`), forecasting queued jobs' starts along the way."""
    if every <= 0 or default_limit <= 0:
        raise ValueError("every and default_limit must be > 0")
    sampler = ForecastSampler(trace, every, default_limit, budget)
    sim: Simulator = Simulator(trace, policy, before=lambda now: sampler.before(sim, now), **replay)
    return sampler.result(sim.run())
