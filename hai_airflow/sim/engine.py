"""The simulation loop: a virtual clock that replays a trace through the platform's own planner."""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hai_airflow.scheduling import high_priority_allowed, plan
from hai_airflow.scheduling.fairshare import MEASURE_SECONDS, UseLedger, charge_rate
from hai_airflow.scheduling.model import (
    Admit,
    Decision,
    Grow,
    Job,
    Node,
    Placement,
    Reject,
    Reservation,
    Reserve,
    Shrink,
    Snapshot,
    Suspend,
)
from hai_airflow.scheduling.state import ClusterState
from hai_airflow.sim.trace import Trace, TraceJob
from hai_airflow.spec import LIVE, WAITING, JobState, checked_move, is_high

DEFAULT_CHECKPOINT_INTERVAL = 1800.0
SETTLE_LIMIT = 10_000
"""Planner cycles allowed at one instant before the simulation gives up as non-converging."""

# Event kinds; simultaneous events are applied together before one planner cycle.
_ARRIVE, _FINISH, _RELEASE, _TICK = 0, 1, 2, 3


class SimulationError(RuntimeError):
    """The planner asked for something impossible (double-booked GPUs, unknown job) or never settled."""


@dataclass(slots=True)
class JobOutcome:
    """What happened to one job; the summary is computed from these alone."""

    job: TraceJob
    high: bool
    """Ran as high priority (after the quota check at submission)."""
    downgraded: bool
    """Asked for high priority beyond its quota at submission, so ran as low."""
    first_started_at: float | None = None
    finished_at: float | None = None
    rejected: str | None = None
    suspensions: int = 0
    lost_gpu_seconds: float = 0.0
    gpu_seconds: float = 0.0
    """GPU-seconds allocated to the job, lost work included."""
    run_seconds: float = 0.0
    """Seconds the job held its placement over its ended runs, lost work included (what a server's
    history records as its runtime)."""
    shrinks: int = 0
    grows: int = 0


@dataclass(frozen=True, slots=True)
class SimRun:
    """The raw result of one simulation: per-job outcomes and the planner's wall-clock cost."""

    policy: str
    nodes: tuple[Node, ...]
    outcomes: tuple[JobOutcome, ...]
    fair_share: bool
    cycle_seconds: tuple[float, ...]
    wall_seconds: float


@dataclass(slots=True)
class _Live:
    """Mutable simulation state of one submitted, unfinished job."""

    out: JobOutcome
    max_schedule: int
    state: JobState = JobState.PENDING
    work_kept: float = 0.0
    run_started_at: float = 0.0
    placement: Placement = ()
    suspended_at: float | None = None
    suspended_seconds: float = 0.0
    last_checkpoint_at: float | None = None
    generation: int = 0
    """Bumped on every suspension and resize so the run's pending events are recognised as stale."""
    size: int = 0
    """Workers it runs at now, or restarts or resumes at next (below the trace's after a shrink)."""
    restart_on: Placement | None = None
    """Where a resizing job restarts once its notice delay is over; None when not resizing."""


class Simulator:
    """Replays one trace under one policy.

    A job's `cpus`/`memory_gb` are per worker. A suspended job keeps the work up to its last
    checkpoint (one every `checkpoint_interval` seconds of each run; 0 = never checkpoints) or
    all of it if elastic, and its GPUs are freed `suspend_delay` seconds after the decision.
    A resizable job (the trace's `min_workers`) shrunk or grown keeps its work the same way and
    restarts at its new size on the decision's placement `suspend_delay` seconds later, when the
    workers it gives up are freed; those seconds on the GPUs it held count as lost. Work scales
    linearly: at `size` of its `workers` workers a job does size/workers of a second's work a second.
    The planner runs at every event time, or with `cycle_interval` > 0 only at multiples of it
    (like a controller that plans on a timer), which trades admission-time precision for speed.

    :param trace: nodes, jobs and quotas to replay.
    :param policy: planner policy name (see `hai_airflow.scheduling.POLICIES`).
    :param checkpoint_interval: seconds of runtime between checkpoints.
    :param suspend_delay: seconds a suspended job keeps its GPUs (SUSPENDING) before they are free.
    :param cycle_interval: seconds between planner cycles; 0 = at every event time.
    :param progress: called after each event time with the simulated time and the jobs finished so far.
    :param observe: called with each cycle's time and decisions (before they are applied).
    :param before: called with each event time before its events are applied: the state seen then
        (`snapshot`, `seconds_run`) is the one the previous cycle left, unchanged since.
    :param fair_share: order low jobs with the fair-share term, from each user's use as the simulator
        records it (measured every `fairshare.MEASURE_SECONDS`, as the server does); False: without it.
    """

    def __init__(
        self,
        trace: Trace,
        policy: str,
        checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL,
        suspend_delay: float = 0.0,
        cycle_interval: float = 0.0,
        progress: Callable[[float, int], None] | None = None,
        observe: Callable[[float, Sequence[Decision]], None] | None = None,
        before: Callable[[float], None] | None = None,
        fair_share: bool = True,
    ):
        if min(checkpoint_interval, suspend_delay, cycle_interval) < 0:
            raise ValueError("checkpoint_interval, suspend_delay and cycle_interval must be >= 0")
        self.trace = trace
        self.policy = policy
        self.checkpoint_interval = checkpoint_interval
        self.suspend_delay = suspend_delay
        self.cycle_interval = cycle_interval
        self.progress = progress
        self.observe = observe
        self.before = before
        self.fair_share = fair_share
        self._use = UseLedger()
        """Each user's use of the ended runs, for the fair-share term."""
        self._measured_at: float | None = None
        self._finished = 0
        self._next_tick: float | None = None
        self._nodes = {n.name: n for n in trace.nodes}
        self._free: dict[str, set[int]] = {n.name: set(range(n.gpus)) for n in trace.nodes}
        self._live: dict[int, _Live] = {}
        self._state = ClusterState(trace.nodes, trace.quota, policy)
        """The planner's view of every unfinished job, kept by the events below."""
        self._waiting: set[int] = set()
        self._high: set[int] = set()
        self._growable: set[int] = set()
        """Running resizable jobs below their size: the planner may grow them when GPUs free."""
        self._events: list[tuple[float, int, int, int, int]] = []
        self._checkpoints: list[tuple[float, int, int, int]] = []
        """(due time, job id, generation, checkpoint number within the run)."""
        self._seq = 0
        self._outcomes: list[JobOutcome] = []
        self._cycles: list[float] = []

    # ---- running ---------------------------------------------------------------------------

    def run(self) -> SimRun:
        """Advance the clock event by event until nothing is left to happen."""
        started = time.perf_counter()
        for job in self.trace.jobs:
            self._push(job.submit_time, _ARRIVE, job.id, 0)
        by_id = {j.id: j for j in self.trace.jobs}
        settle_at, settle_count = -1.0, 0
        while self._events:
            now = self._events[0][0]
            if self.before is not None:
                self.before(now)
            ticked = False
            while self._events and self._events[0][0] == now:
                _, _, kind, job_id, generation = heapq.heappop(self._events)
                if kind == _ARRIVE:
                    self._arrive(by_id[job_id], now)
                elif kind == _FINISH:
                    self._finish(job_id, generation, now)
                elif kind == _RELEASE:
                    self._release(job_id, generation, now)
                else:
                    ticked = True
                    self._next_tick = None
            if self.progress is not None:
                self.progress(now, self._finished)
            if not self._waiting and not self._growable:
                continue
            if self.cycle_interval > 0 and not ticked:
                self._schedule_tick(now)
                continue
            settle_count = settle_count + 1 if now == settle_at else 1
            settle_at = now
            if settle_count > SETTLE_LIMIT:
                raise SimulationError(f"the planner did not settle at t={now:g}s")
            self._cycle(now)
        return SimRun(
            policy=self.policy,
            nodes=self.trace.nodes,
            outcomes=tuple(self._outcomes),
            fair_share=self.fair_share,
            cycle_seconds=tuple(self._cycles),
            wall_seconds=time.perf_counter() - started,
        )

    # ---- what an observer may read ----------------------------------------------------------

    @property
    def outcomes(self) -> Sequence[JobOutcome]:
        """Every submitted job's outcome so far, in submit order (appended to, never reordered)."""
        return self._outcomes

    def snapshot(self) -> Snapshot:
        """The planner's view of the cluster as it stands."""
        return self._state.snapshot()

    def seconds_run(self, job_id: int, now: float) -> float:
        """Seconds an unfinished job has held a placement over all its runs, the current one included."""
        live = self._live[job_id]
        holding = live.state in LIVE
        return live.out.run_seconds + (now - live.run_started_at if holding else 0.0)

    def _schedule_tick(self, now: float) -> None:
        """Plan at the first timer tick at or after `now`, once however many events led up to it."""
        # The epsilon keeps `now` on a tick from rounding up to the next one.
        tick = max(now, math.ceil(now / self.cycle_interval - 1e-9) * self.cycle_interval)
        if self._next_tick is None or tick < self._next_tick:
            self._next_tick = tick
            self._push(tick, _TICK, -1, 0)

    def _push(self, at: float, kind: int, job_id: int, generation: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at, self._seq, kind, job_id, generation))

    def _cycle(self, now: float) -> None:
        """1. bring checkpoints up to `now`; 2. snapshot; 3. plan (timed); 4. apply the decisions."""
        self._refresh_checkpoints(now)
        self._measure_use(now)
        began = time.perf_counter()
        decisions = plan(self._state.snapshot(), now, self._state.usage)
        self._cycles.append(time.perf_counter() - began)
        if self.observe is not None:
            self.observe(now, decisions)
        for decision in decisions:
            if isinstance(decision, Admit):
                self._admit(decision, now)
            elif isinstance(decision, Suspend):
                self._suspend(decision, now)
            elif isinstance(decision, Reserve):
                self._reserve(decision)
            elif isinstance(decision, Reject):
                self._reject(decision)
            elif isinstance(decision, Shrink | Grow):
                self._resize(decision, now)

    def _measure_use(self, now: float) -> None:
        """Hand the cluster state the users' recent use, at most every MEASURE_SECONDS."""
        if not self.fair_share or (
            self._measured_at is not None and now - self._measured_at < MEASURE_SECONDS
        ):
            return
        self._measured_at = now
        running = (
            (lv.out.job.user, _charge(lv), lv.run_started_at) for lv in self._live.values() if lv.placement
        )
        self._state.use_measured(self._use.measure(running, now))

    # ---- events ----------------------------------------------------------------------------

    def _arrive(self, job: TraceJob, now: float) -> None:
        high = is_high(job.max_schedule)
        downgraded = high and not self._quota_allows(job)
        max_schedule = 0 if downgraded else job.max_schedule
        out = JobOutcome(job=job, high=is_high(max_schedule), downgraded=downgraded)
        self._outcomes.append(out)
        live = _Live(out=out, max_schedule=max_schedule, size=job.workers)
        self._live[job.id] = live
        self._waiting.add(job.id)
        if out.high:
            self._high.add(job.id)
        self._show(live)

    def _finish(self, job_id: int, generation: int, now: float) -> None:
        live = self._live.get(job_id)
        if live is None or live.generation != generation or live.state != JobState.RUNNING:
            return
        self._move(live, JobState.SUCCEEDED, "completed")
        live.out.finished_at = now
        self._finished += 1
        self._free_gpus(live, now)
        self._forget(job_id)

    def _release(self, job_id: int, generation: int, now: float) -> None:
        live = self._live[job_id]
        if live.generation != generation or live.state != JobState.SUSPENDING:
            return
        if live.restart_on is not None:
            self._restart(live, now)
            return
        self._free_gpus(live, now)
        self._move(live, JobState.SUSPENDED, "suspended")
        live.suspended_at = now
        self._waiting.add(job_id)
        self._show(live)

    # ---- decisions -------------------------------------------------------------------------

    def _admit(self, decision: Admit, now: float) -> None:
        live = self._known(decision.job_id, decision)
        self._move(live, JobState.STARTING, "admitted")
        self._take_gpus(live.out.job, decision.placement, live.size, decision)
        if live.suspended_at is not None:
            live.suspended_seconds += now - live.suspended_at
            live.suspended_at = None
        if live.out.first_started_at is None:
            live.out.first_started_at = now
        self._start_run(live, decision.placement, now)

    def _start_run(self, live: _Live, placement: Placement, now: float) -> None:
        """Run on `placement` from `now` (GPUs taken) until the work left is done at the job's size."""
        job = live.out.job
        self._move(live, JobState.RUNNING, "started")
        live.run_started_at = now
        live.placement = placement
        self._waiting.discard(job.id)
        self._state.reservation_cleared(job.id)
        remaining = _seconds_for(job, live.size, job.duration - live.work_kept)
        self._push(now + remaining, _FINISH, job.id, live.generation)
        if self.checkpoint_interval > 0:
            due = now + self.checkpoint_interval
            heapq.heappush(self._checkpoints, (due, job.id, live.generation, 1))
        if job.resizable and live.size < job.workers:
            self._growable.add(job.id)
        self._show(live)

    def _suspend(self, decision: Suspend, now: float) -> None:
        live = self._known(decision.job_id, decision)
        self._move(live, JobState.SUSPENDING, "suspending")
        self._stop_run(live, now)
        live.out.suspensions += 1
        self._push(now + self.suspend_delay, _RELEASE, decision.job_id, live.generation)
        self._show(live)

    def _stop_run(self, live: _Live, now: float) -> None:
        """The job got the notice (it is SUSPENDING): it keeps the work saved by then, holding its GPUs."""
        job = live.out.job
        ran = now - live.run_started_at
        kept = ran if job.elastic else self._checkpointed(ran)
        live.work_kept += _work_done(job, live.size, kept)
        live.out.lost_gpu_seconds += (ran - kept) * len(live.placement) * job.gpus_per_worker
        live.generation += 1
        self._growable.discard(job.id)

    def _resize(self, decision: Shrink | Grow, now: float) -> None:
        """Notice now; `suspend_delay` later the job restarts at `decision.to` workers (`_restart`)."""
        live = self._known(decision.job_id, decision)
        self._move(live, JobState.SUSPENDING, "resizing")
        _check_resize(live, decision)
        self._stop_run(live, now)
        job = live.out.job
        live.out.lost_gpu_seconds += self.suspend_delay * len(live.placement) * job.gpus_per_worker
        if isinstance(decision, Shrink):
            live.out.shrinks += 1
        else:
            live.out.grows += 1
        live.size = decision.to
        live.restart_on = decision.placement
        # The GPUs it restarts on are held for it meanwhile, as the server holds them.
        self._state.reserved(job.id, (Reservation(job.id, w.node, w.gpus) for w in decision.placement))
        self._push(now + self.suspend_delay, _RELEASE, job.id, live.generation)
        self._show(live)

    def _restart(self, live: _Live, now: float) -> None:
        """The notice delay is over: the workers given up are freed and the job runs at its new size, its
        instance ended and a new one started at once, as the server moves it."""
        placement = live.restart_on
        assert placement is not None
        live.restart_on = None
        self._move(live, JobState.SUSPENDED, "resized")
        self._move(live, JobState.STARTING, "admitted")
        self._free_gpus(live, now)
        self._take_gpus(live.out.job, placement, live.size, f"restart of job {live.out.job.id}")
        self._start_run(live, placement, now)

    def _reserve(self, decision: Reserve) -> None:
        self._known(decision.job_id, decision)
        self._state.reserved(
            decision.job_id, (Reservation(decision.job_id, w.node, w.gpus) for w in decision.placement)
        )

    def _reject(self, decision: Reject) -> None:
        live = self._known(decision.job_id, decision)
        if live.state not in WAITING:  # a running job may fail, but a plan rejects only waiting ones
            raise SimulationError(f"{decision}: job {decision.job_id} is {live.state}, not waiting")
        self._move(live, JobState.FAILED, "rejected")
        live.out.rejected = decision.reason
        self._forget(decision.job_id)

    # ---- bookkeeping -----------------------------------------------------------------------

    @staticmethod
    def _move(live: _Live, to_state: JobState, kind: str) -> None:
        """Move the job's state as the server does: only along `spec.MOVES` (IllegalMove otherwise)."""
        live.state = checked_move(live.out.job.id, live.state, to_state, kind)

    def _known(self, job_id: int, decision: object) -> _Live:
        live = self._live.get(job_id)
        if live is None:
            raise SimulationError(f"{decision}: no such unfinished job")
        return live

    def _checkpoints_in(self, ran: float) -> int:
        """How many periodic checkpoints a run that lasted `ran` seconds has written."""
        if self.checkpoint_interval <= 0:
            return 0
        # The epsilon keeps a checkpoint due exactly now from being lost to float rounding.
        return math.floor(ran / self.checkpoint_interval + 1e-9)

    def _checkpointed(self, ran: float) -> float:
        """Runtime saved by the periodic checkpoints of a run that lasted `ran` seconds."""
        return self._checkpoints_in(ran) * self.checkpoint_interval

    def _refresh_checkpoints(self, now: float) -> None:
        """Advance `last_checkpoint_at` of running jobs that have checkpointed since the last cycle."""
        interval = self.checkpoint_interval
        while self._checkpoints and self._checkpoints[0][0] <= now:
            _, job_id, generation, count = heapq.heappop(self._checkpoints)
            live = self._live.get(job_id)
            if live is None or live.generation != generation or live.state != JobState.RUNNING:
                continue
            count = max(count, self._checkpoints_in(now - live.run_started_at))
            live.last_checkpoint_at = live.run_started_at + count * interval
            due = live.run_started_at + (count + 1) * interval
            heapq.heappush(self._checkpoints, (due, job_id, generation, count + 1))
            self._show(live)

    def _take_gpus(self, job: TraceJob, placement: Placement, workers: int, decision: object) -> None:
        if len(placement) != workers:
            raise SimulationError(f"{decision}: {workers} workers expected")
        for worker in placement:
            free = self._free.get(worker.node)
            if free is None:
                raise SimulationError(f"{decision}: no node {worker.node!r}")
            if len(worker.gpus) != job.gpus_per_worker or not free.issuperset(worker.gpus):
                raise SimulationError(f"{decision}: GPUs {worker.gpus} on {worker.node} are not free")
            if self._nodes[worker.node].gpu_type != job.gpu_type and job.gpu_type is not None:
                raise SimulationError(f"{decision}: {worker.node} has no {job.gpu_type}")
            free.difference_update(worker.gpus)

    def _free_gpus(self, live: _Live, now: float) -> None:
        for worker in live.placement:
            self._free[worker.node].update(worker.gpus)
        held = len(live.placement) * live.out.job.gpus_per_worker
        live.out.gpu_seconds += (now - live.run_started_at) * held
        self._use.run_ended(live.out.job.user, _charge(live), live.run_started_at, now)
        live.out.run_seconds += now - live.run_started_at
        live.placement = ()

    def _forget(self, job_id: int) -> None:
        del self._live[job_id]
        self._growable.discard(job_id)
        self._state.job_left(job_id)
        self._state.reservation_cleared(job_id)
        self._waiting.discard(job_id)
        self._high.discard(job_id)

    def _show(self, live: _Live) -> None:
        """Give the cluster state the job's new (immutable) record after its state changed."""
        job = live.out.job
        holding = live.state in LIVE
        self._state.job_changed(Job(
            id=job.id,
            user=job.user,
            group=job.group,
            state=live.state,
            max_schedule=live.max_schedule,
            submitted_at=job.submit_time,
            workers=live.size,
            gpus_per_worker=job.gpus_per_worker,
            cpus_per_worker=job.cpus,
            memory_gb_per_worker=job.memory_gb,
            gpu_type=job.gpu_type,
            started_at=live.run_started_at if holding else None,
            placement=live.placement if holding else (),
            suspended_seconds=live.suspended_seconds,
            suspended_at=live.suspended_at,
            preemptions=live.out.suspensions,
            last_checkpoint_at=live.last_checkpoint_at,
            elastic=job.elastic,
            min_workers=(job.min_workers or 0) if job.resizable else 0,
            max_workers=job.workers if job.resizable else 0,
        ))

    def _quota_allows(self, job: TraceJob) -> bool:
        """The platform's submit-time check; only unfinished high-priority jobs count as usage."""
        high_views = (self._state.jobs[i] for i in self._high)
        verdict = high_priority_allowed(job.user, job.group, job.total_gpus, high_views, self.trace.quota)
        return verdict.allowed


def _charge(live: _Live) -> float:
    """GPU-seconds a second the job's run is charged for the fair share, at the workers it holds."""
    job, workers = live.out.job, len(live.placement)
    return charge_rate(workers * job.gpus_per_worker, workers * job.cpus)


def _work_done(job: TraceJob, size: int, seconds: float) -> float:
    """Seconds of the job's work (its duration at all its workers) done in `seconds` at `size` workers."""
    return seconds if size == job.workers else seconds * size / job.workers


def _seconds_for(job: TraceJob, size: int, work: float) -> float:
    """Seconds `size` workers take for `work` seconds of the job's work (linear scaling)."""
    return work if size == job.workers else work * job.workers / size


def _check_resize(live: _Live, decision: Shrink | Grow) -> None:
    """A resize within the job's bounds that keeps its workers (a shrink) or adds to them (a grow)."""
    job, to = live.out.job, decision.to
    if not job.resizable or job.min_workers is None:
        raise SimulationError(f"{decision}: job {job.id} is not resizable")
    if not job.min_workers <= to <= job.workers:
        raise SimulationError(f"{decision}: {to} workers is outside {job.min_workers}..{job.workers}")
    if len(decision.placement) != to:
        raise SimulationError(f"{decision}: {len(decision.placement)} placements for {to} workers")
    shrink = isinstance(decision, Shrink)
    if (to < live.size) != shrink or to == live.size:
        raise SimulationError(f"{decision}: job {job.id} runs at {live.size} workers")
    fewer, more = (decision.placement, live.placement) if shrink else (live.placement, decision.placement)
    if not set(fewer) <= set(more):
        raise SimulationError(f"{decision}: the placement does not keep the job's own workers")


def simulate(
    trace: Trace,
    policy: str,
    checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL,
    suspend_delay: float = 0.0,
    cycle_interval: float = 0.0,
    progress: Callable[[float, int], None] | None = None,
    fair_share: bool = True,
) -> SimRun:
    """Replay `trace` under `policy` until every job has finished or can go no further."""
    return Simulator(
        trace, policy, checkpoint_interval, suspend_delay, cycle_interval, progress, fair_share=fair_share
    ).run()
