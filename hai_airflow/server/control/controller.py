"""The controller loop: while this server holds the lease, record exits, keep the cluster state by
the change feed, plan, apply the decisions through the backend, and scan for checkpoints. Each of
those is its own class; `Controller.step` is the list of their calls."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from sqlalchemy import select, text

from hai_airflow.backends.common.base import Backend, BackendUnavailable, Exit, Handle
from hai_airflow.scheduling import plan
from hai_airflow.scheduling.model import Decision
from hai_airflow.scheduling.settled import Settled
from hai_airflow.server.control.applier import PlanApplier
from hai_airflow.server.control.exits import ExitRecorder
from hai_airflow.server.control.forecaster import Forecaster
from hai_airflow.server.control.keeper import Keeper
from hai_airflow.server.control.mirror import Kept, StoreFollower
from hai_airflow.server.control.scanner import CheckpointScanner
from hai_airflow.server.jobs.recent_use import UseMeter
from hai_airflow.server.jobs.snapshot import StoreView
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.store import clock, lease
from hai_airflow.server.store.outage import STORE_UNAVAILABLE, Outage
from hai_airflow.server.store.tables import InstanceRow, JobRow
from hai_airflow.spec import stop_order

log = logging.getLogger("hai.server.controller")

TICK_SECONDS = 1.0
"""A full planning cycle at least this often, even when nothing woke the controller."""
POLL_SECONDS = 0.2
"""How often the backend is asked for exits while this controller is active."""
RETRY_SECONDS = 1.0
"""How long after a failed step the next one comes."""
SETTLE_FACTOR = 1.0
"""After a cycle that took t seconds, a wake-up (a submit, a request) plans again no sooner than
SETTLE_FACTOR x t after it ended: under a stream of submissions the controller plans at most about
half the time, leaving the rest to the API, and a burst is planned in one cycle. Exits plan at once."""


class Controller:
    """Acts on the store only while it holds the lease; a second server waits as a standby."""

    def __init__(self, ctx: ServerContext, backend: Backend, lease_seconds: float = lease.LEASE_SECONDS):
        self.ctx = ctx
        self.backend = backend
        # An exit frees GPUs: plan at once rather than on the next poll.
        backend.on_exit = ctx.wakeup.set
        self.me = ctx.holder_id
        self.lease = lease.Holding(ctx.store, self.me, lease_seconds)
        self.active = False
        self._stopping = threading.Event()
        self._outage = Outage(log, "controller")
        self._thread: threading.Thread | None = None
        self._woken = True
        self._last_cycle = 0.0
        self._settled_at = 0.0
        self.scanner = CheckpointScanner(ctx, self.lease.write)
        self.exits = ExitRecorder(ctx, self.lease.write, self.scanner.checkpoint_of)
        self.keeper = Keeper(ctx, self.lease.write)
        self.applier = PlanApplier(ctx, backend, self.lease.write)
        self.settled: Settled | None = None
        """Set after a plan that only made jobs wait: until the next event, a cycle does not plan."""
        self.forecaster = Forecaster(ctx.store)
        ctx.forecaster = self.forecaster
        self.use = UseMeter(ctx.store)
        """The users' recent use, for the fair-share term of low jobs' weight."""

    @property
    def follower(self) -> StoreFollower:
        """The store as this controller keeps it between cycles (read whole on taking the lease)."""
        return self.keeper.follower

    # ---- lifetime -----------------------------------------------------------------------------

    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="hai-controller", daemon=True)
        self._thread.start()
        self.forecaster.start()

    def stop(self) -> None:
        """Stop acting and hand the lease back; running instances keep running for the next controller."""
        self._stopping.set()
        self.ctx.wakeup.set()
        self.forecaster.stop()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self.active:
            try:
                self.lease.release()
            except Exception:
                log.exception("could not release the controller lease; it expires by itself")
            self.active = False
        self.backend.close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            if not self.attempt():
                self._stopping.wait(RETRY_SECONDS)  # not at once: a failure is likely to recur
                continue
            if not self.active:
                # A standby only looks whether the lease is free: wake-ups (its own API's, and every
                # other server's through the channel) are for the holder.
                self._stopping.wait(TICK_SECONDS)
                continue
            wait = POLL_SECONDS
            if self._woken:  # a wake-up waits for the settle time of the last cycle
                wait = min(wait, max(self._settled_at - clock.now(), 0.02))
            self._woken = self.ctx.wakeup.wait(wait) or self._woken

    def attempt(self) -> bool:
        """One step, whatever happens; False when it failed. A lost lease stands this controller by, a
        store outage is waited out, a backend that does not answer is said in one line, any other
        failure is logged; after a failure inside a transaction the next read of the store is whole
        (the failed transaction may have expired kept rows)."""
        try:
            self.step()
        except lease.LeaseLost:
            log.warning("controller lease taken over by another server; standing by")
            self.active = False
        except STORE_UNAVAILABLE as e:
            self._outage.failed(e)
            self.keeper.forget()
            return False
        except BackendUnavailable as e:
            log.warning("%s", e)
            return False
        except Exception:
            log.exception("controller step failed; retrying")
            self.keeper.forget()
            return False
        else:
            if self._outage.since is not None:
                self._probe_store()
        return True

    def _probe_store(self) -> None:
        """After an outage, whether the store answers again (a step may not have asked it anything)."""
        try:
            with self.ctx.store.read() as s:
                s.execute(text("SELECT 1"))
        except STORE_UNAVAILABLE as e:
            self._outage.failed(e)
        else:
            self._outage.recovered()

    # ---- one step -----------------------------------------------------------------------------

    def step(self, force: bool = False) -> None:
        """Take the lease if free, record exits, plan when woken, after exits, or every tick, and scan
        for checkpoints now and then."""
        now = clock.now()
        if (gap := clock.CLOCK.step_seen()) is not None:
            log.warning(
                "the wall clock stepped by %+.1f s; the server keeps its own time and takes the step up "
                "over %.0f s, so grace periods, time limits and the lease last what they say",
                gap, abs(gap) / clock.SLEW,
            )
        if not self.active and not self._acquire(now):
            return
        self.lease.renew_if_due(now)
        exited = self.exits.take(self.backend.poll())
        woken = self._woken and now >= self._settled_at
        if force or exited or woken or now - self._last_cycle >= TICK_SECONDS:
            self._woken = False
            self._last_cycle = now
            with self.ctx.metrics.planner_cycle.time():
                self.cycle()
            ended = clock.now()
            self._settled_at = ended + SETTLE_FACTOR * (ended - now)
        self.scanner.scan_if_due(now)

    def _acquire(self, now: float) -> bool:
        if not self.lease.acquire(now):
            return False
        log.info("controller %s holds the lease", self.me)
        self.active = True
        self.keeper.last_resync = 0.0  # another controller acted meanwhile: read the store whole first
        try:
            self.reattach()
        except BaseException:
            # Acting without having adopted the running instances would lose their exits;
            # the next step takes the (still ours) lease again and retries.
            self.active = False
            raise
        return True

    def cycle(self) -> None:
        """Requests first (cancel, hold), time limits and dependencies, then a plan over a fresh snapshot,
        applied in order; no plan (nor snapshot) while the cluster is as the last plan, which only made
        jobs wait, left it (`Settled`)."""
        kept = self._read()
        now = clock.now()
        if self.applier.requests(kept) | self.applier.expire(kept, now) | self.applier.release(kept, now):
            kept = self._read()
        now, state = clock.now(), self.follower.state
        settled = self.settled.holds(state, now) if self.settled is not None else None
        if settled is not None:
            if self.settled is not None and settled.arrived != self.settled.arrived:
                self._offer_forecast(self.follower.view(), None)  # new jobs that wait anyway
            self.settled = settled
            self.ctx.metrics.settled_cycles.inc()
            return
        view = self.follower.view()
        decisions = plan(view.snapshot, now, view.usage)
        self.settled = Settled.after(decisions, state, now)
        self._offer_forecast(view, decisions)
        self.applier.apply(view, decisions, kept)

    def _offer_forecast(self, view: StoreView, decisions: list[Decision] | None) -> None:
        """Hand what was planned (None: new jobs wait, unplanned) to the forecaster; nothing it does
        may stop a cycle."""
        try:
            self.forecaster.offer(view.snapshot, view.jobs, view.current, decisions)
        except Exception:
            log.exception("could not hand the plan to the forecaster; scheduling goes on")

    def _read(self) -> Kept:
        kept, whole = self.keeper.read()
        if whole:
            self.settled = None  # a new state counts its events afresh
        self.use.measure(kept.state, clock.now())
        return kept

    # ---- restart safety -----------------------------------------------------------------------

    def reattach(self) -> None:
        """Adopt instances a previous controller started; the lost ones go back to the queue."""
        with self.ctx.store.read() as s:
            live = list(s.scalars(select(InstanceRow).where(InstanceRow.ended_at.is_(None))))
        handles = [Handle(i.id, json.loads(i.handle)) for i in live if i.handle]
        # Even with no handles: the backend removes here what it started but no handle names.
        lost = self.backend.reattach(handles)
        adopted = len(handles) - len(lost)
        for i in live:
            if i.handle:
                continue
            # The server died between starting the instance and saving its handle: whatever did start
            # must be gone before the job is requeued, or it would run twice on the same GPUs.
            self.backend.reap(i.id, Path(i.work_dir))
            lost.append(Exit(i.id, None, "the server stopped before the instance was started", lost=True))
        # With the exits still unwritten, as a step does: each keeps its count of failed writes.
        self.exits.take(lost)
        gone = {e.instance_id for e in lost}
        self._stop_again([i for i in live if i.handle and i.stop_kind and i.id not in gone])
        log.info("re-attached %d instance(s), %d lost", adopted, len(lost))

    def _stop_again(self, stopping: list[InstanceRow]) -> None:
        """Ask again for the stops asked before the restart (the old controller may have died first),
        as `stop_order` says: the notice only to an elastic job, with what is left of the grace."""
        if not stopping:
            return
        with self.ctx.store.read() as s:
            ids = {i.job_id for i in stopping}
            elastic = dict(s.execute(select(JobRow.id, JobRow.elastic).where(JobRow.id.in_(ids))).all())
        now = clock.now()
        for i in stopping:
            assert i.stop_kind is not None
            order = stop_order(i.stop_kind, elastic[i.job_id], i.grace_seconds, i.stop_requested_at, now)
            self.backend.stop(i.id, order.grace_seconds, order.notice)
