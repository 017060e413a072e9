"""The controller loop: hold the lease, keep the cluster state by the change feed, plan, apply the
decisions through the backend."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from hai_airflow.backends import logs
from hai_airflow.backends.base import Backend, Exit, Handle
from hai_airflow.scheduling import plan
from hai_airflow.scheduling.model import Admit, Reject, Reserve, Suspend, Wait
from hai_airflow.scheduling.settled import Settled
from hai_airflow.server import admission, by_id, changes, heap, lease, paths, transitions
from hai_airflow.server.admission import parse_spec
from hai_airflow.server.checkpoints import Checkpoint, newest_checkpoint
from hai_airflow.server.context import ServerContext
from hai_airflow.server.follow import Kept, StoreFollower, differences, read_all
from hai_airflow.server.hints import failure_hint
from hai_airflow.server.metrics import lost_gpu_seconds
from hai_airflow.server.snapshot import WAITING, StoreView
from hai_airflow.server.tables import InstanceRow, JobRow

log = logging.getLogger("hai.server.controller")

_Seen = tuple[Exit, Checkpoint | None, str | None]
"""An exit to record, with the newest checkpoint and the failure hint its instance's files gave."""


TICK_SECONDS = 1.0
"""A full planning cycle at least this often, even when nothing woke the controller."""
POLL_SECONDS = 0.2
"""How often the backend is asked for exits while this controller is active."""
SETTLE_FACTOR = 1.0
"""After a cycle that took t seconds, a wake-up (a submit, a request) plans again no sooner than
SETTLE_FACTOR x t after it ended: under a stream of submissions the controller plans at most about
half the time, leaving the rest to the API, and a burst is planned in one cycle. Exits plan at once."""
RENEW_SECONDS = 2.0
CHECKPOINT_SCAN_SECONDS = 2.0
"""How often the running jobs' model dirs are scanned for a newer checkpoint, at most."""
SCAN_SHARE = 0.1
"""And no more than this share of the controller's time: a scan that took t seconds (a thousand
running jobs' dirs) waits t / SCAN_SHARE for the next, so cycles are not held up behind scans."""
RESYNC_SECONDS = 300.0
"""How often the kept copy of the store is checked against a full read (and replaced by it)."""
FEED_KEPT_SECONDS = 3600.0
"""How long change-feed rows are kept (a controller taking over reads the store whole)."""
CANCEL_GRACE_SECONDS = 3
HINT_LOG_LINES = 400


class Controller:
    """Acts on the store only while it holds the lease; a second server waits as a standby."""

    def __init__(self, ctx: ServerContext, backend: Backend, lease_seconds: float = lease.LEASE_SECONDS):
        self.ctx = ctx
        self.backend = backend
        # An exit frees GPUs: plan at once rather than on the next poll.
        backend.on_exit = ctx.wakeup.set
        self.me = ctx.holder_id
        self.lease_seconds = lease_seconds
        self.active = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._woken = True
        self._last_cycle = 0.0
        self._last_scan = 0.0
        self._scan_every = CHECKPOINT_SCAN_SECONDS
        self._last_renew = 0.0
        self._last_resync = 0.0
        self._settled_at = 0.0
        self._unapplied: list[Exit] = []
        """Exits taken from the backend whose write failed (for want of the store, or for a fault of
        their own): written next step."""
        self._failures: dict[int, int] = {}
        """Failed writes so far of each exit in `_unapplied` that failed for a fault of its own."""
        self.follower = StoreFollower(ctx.config.server.policy)
        """The store as this controller keeps it between cycles (read whole on taking the lease)."""
        self.settled: Settled | None = None
        """Set after a plan that only made jobs wait: until the next event, a cycle does not plan."""

    # ---- lifetime -----------------------------------------------------------------------------

    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="hai-controller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop acting and hand the lease back; running instances keep running for the next controller."""
        self._stopping.set()
        self.ctx.wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self.active:
            try:
                with self.ctx.store.write() as s:
                    lease.release(s, self.me)
            except Exception:
                log.exception("could not release the controller lease; it expires by itself")
            self.active = False
        self.backend.close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.step()
            except lease.LeaseLost:
                log.warning("controller lease taken over by another server; standing by")
                self.active = False
            except Exception:
                log.exception("controller step failed; retrying")
            if not self.active:
                # A standby only looks whether the lease is free: wake-ups (its own API's, and every
                # other server's through the channel) are for the holder.
                self._stopping.wait(TICK_SECONDS)
                continue
            wait = POLL_SECONDS
            if self._woken:  # a wake-up waits for the settle time of the last cycle
                wait = min(wait, max(self._settled_at - time.time(), 0.02))
            self._woken = self.ctx.wakeup.wait(wait) or self._woken

    # ---- one step -----------------------------------------------------------------------------

    def step(self, force: bool = False) -> None:
        """Take the lease if free, collect exits, and plan when woken, after exits, or every tick."""
        now = time.time()
        if not self.active and not self._acquire(now):
            return
        if now - self._last_renew >= RENEW_SECONDS:
            with self.ctx.store.write() as s:
                lease.renew(s, self.me, now, self.lease_seconds)
            self._last_renew = now
        exits = self._unapplied + self.backend.poll()
        if exits:
            try:
                failed = self.apply_exits(exits)
            except OperationalError:
                # The backend reports an exit once: kept until the store takes it (a restart would
                # learn it again from the exit files).
                self._unapplied = exits
                raise
            self._unapplied = self._again(failed)
        woken = self._woken and now >= self._settled_at
        if force or exits or woken or now - self._last_cycle >= TICK_SECONDS:
            self._woken = False
            self._last_cycle = now
            with self.ctx.metrics.planner_cycle.time():
                self.cycle()
            ended = time.time()
            self._settled_at = ended + SETTLE_FACTOR * (ended - now)
        if now - self._last_scan >= self._scan_every:
            self._last_scan = now
            started = time.monotonic()
            self.scan_checkpoints()
            took = time.monotonic() - started
            self._scan_every = max(CHECKPOINT_SCAN_SECONDS, took / SCAN_SHARE)

    def _acquire(self, now: float) -> bool:
        with self.ctx.store.write() as s:
            got = lease.try_acquire(s, self.me, now, self.lease_seconds)
        if got:
            log.info("controller %s holds the lease", self.me)
            self.active = True
            self._last_renew = now
            self._last_resync = 0.0  # another controller acted meanwhile: read the store whole first
            try:
                self.reattach()
            except BaseException:
                # Acting without having adopted the running instances would lose their exits;
                # the next step takes the (still ours) lease again and retries.
                self.active = False
                raise
        return got

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """A write transaction that first renews the lease, so a deposed controller cannot write."""
        with self.ctx.store.write() as s:
            now = time.time()
            lease.renew(s, self.me, now, self.lease_seconds)
            self._last_renew = now
            yield s

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
        if lost or self._unapplied:
            # With the exits still unwritten, as a step does: each keeps its count of failed writes.
            self._unapplied = self._again(self.apply_exits(self._unapplied + lost))
        gone = {e.instance_id for e in lost}
        for i in live:
            # A stop asked for before the restart is asked again: the old controller may have died first.
            if i.handle and i.stop_kind and i.id not in gone:
                left = (
                    0
                    if i.stop_requested_at is None
                    else i.grace_seconds - (time.time() - i.stop_requested_at)
                )
                notice = i.stop_kind in ("preempt", "hold") and i.grace_seconds > 0
                self.backend.stop(i.id, max(0, int(left)), notice)
        log.info("re-attached %d instance(s), %d lost", adopted, len(lost))

    # ---- exits --------------------------------------------------------------------------------

    def apply_exits(self, exits: list[Exit]) -> list[Exit]:
        """Record how instances ended, all in one write: a wave of jobs ends together (the local
        backend reports the exits it saw at once), so each costs statements, not transactions.

        Returns the exits not recorded. When the write fails for something one exit may have caused,
        each is written again in its own transaction, so that fault is that exit's alone, and an exit
        that fails alone is written once more without what its files gave (checkpoint, failure hint);
        an unusable store (`OperationalError`) fails them all at once and raises.
        """
        with self.ctx.store.read() as s:
            insts, jobs = self._rows_of(s, exits)
        # What needs the file system comes before the transaction: newest checkpoints, failure hints.
        seen: list[_Seen] = []
        for ex in exits:
            inst = insts.get(ex.instance_id)
            job = jobs.get(inst.job_id) if inst is not None else None
            if inst is None or job is None or inst.ended_at is not None:
                continue
            seen.append((ex, *self._findings(job, inst, ex)))
        if not seen:
            return []
        failed = self._write_exits(seen)
        self.ctx.changed.notify()
        self.ctx.wakeup.set()
        return failed

    def _findings(self, job: JobRow, inst: InstanceRow, ex: Exit) -> tuple[Checkpoint | None, str | None]:
        """The instance's newest checkpoint and a hint at why it failed, from its files; neither when
        they cannot be read: the exit is recorded all the same."""
        try:
            final = self._checkpoint_of(job.user_name, job.group_name, inst)
            hint = None
            if not ex.lost and ex.exit_code not in (0, None) and inst.stop_kind is None:
                last = logs.read_tail(Path(inst.log_path), HINT_LOG_LINES, home=self.ctx.home)
                hint = failure_hint(job.gpu_type, last)
        except Exception:
            log.exception(
                "reading the files of instance %d failed; its exit is recorded without them", inst.id
            )
            return None, None
        return final, hint

    def _write_exits(self, seen: list[_Seen]) -> list[Exit]:
        """Write the exits in one transaction, else each in its own; returns the exits not written."""
        try:
            self._write_ended(seen)
        except (OperationalError, lease.LeaseLost):
            raise
        except Exception:
            if len(seen) > 1:
                return [ex for one in seen for ex in self._write_exits([one])]
            ex, final, hint = seen[0]
            failures = self._failures.get(ex.instance_id, 0)
            logged = failures == 0 or math.log10(failures).is_integer()  # the first, the 10th, the 100th...
            if final is not None or hint is not None:
                # What the files gave may be what the store refused: the exit matters more.
                if logged:
                    log.exception(
                        "recording the exit of instance %d failed; recording it without its "
                        "checkpoint and failure hint",
                        ex.instance_id,
                    )
                return self._write_exits([(ex, None, None)])
            if logged:
                log.exception(
                    "recording the exit of instance %d failed (%d times before)", ex.instance_id, failures
                )
            return [ex]
        return []

    def _again(self, failed: list[Exit]) -> list[Exit]:
        """The exits to write again at the next step: all that failed (an exit is never dropped: the
        backend reports it once); the others are written meanwhile."""
        self._failures = {ex.instance_id: self._failures.get(ex.instance_id, 0) + 1 for ex in failed}
        return failed

    def _write_ended(self, seen: list[_Seen]) -> None:
        """One transaction for the exits: each one's checkpoint, the instance's end, the job's state."""
        ended: list[tuple[Exit, int, transitions.Outcome, float]] = []
        with self._write() as s:
            insts, jobs = self._rows_of(s, [ex for ex, _, _ in seen])
            now = time.time()
            for ex, final, hint in seen:
                inst = insts.get(ex.instance_id)
                job = jobs.get(inst.job_id) if inst is not None else None
                if inst is None or job is None or inst.ended_at is not None:
                    continue
                if final is not None and (
                    job.latest_checkpoint_at is None or final.at > job.latest_checkpoint_at
                ):
                    transitions.checkpoint_seen(s, job, final, now)
                outcome = transitions.exit_outcome(job, inst, ex, hint)
                requeued = outcome.job_state == "SUSPENDED"
                lost = lost_gpu_seconds(job, inst, now) if requeued and not job.elastic else 0.0
                transitions.instance_ended(s, job, inst, ex, outcome, now)
                ended.append((ex, job.id, outcome, lost))
        for ex, job_id, outcome, lost in ended:
            self.ctx.metrics.instance_ended(outcome.end_reason, outcome.job_state == "SUSPENDED", lost)
            log.info("instance %d of job %d ended: %s", ex.instance_id, job_id, outcome.reason)

    @staticmethod
    def _rows_of(s: Session, exits: list[Exit]) -> tuple[dict[int, InstanceRow], dict[int, JobRow]]:
        """The ended instances and their jobs, a query per table."""
        insts = by_id.rows(s, InstanceRow, (ex.instance_id for ex in exits))
        return insts, by_id.rows(s, JobRow, {i.job_id for i in insts.values()})

    # ---- planning -----------------------------------------------------------------------------

    def read(self) -> Kept:
        """The store as kept: the change feed applied since the last cycle; read whole every
        RESYNC_SECONDS (and at first), when a difference from the kept copy is logged."""
        now = time.time()
        if now - self._last_resync < RESYNC_SECONDS and self.follower.kept is not None:
            with self.ctx.store.read() as s:
                self.follower.catch_up(s)
            return self.follower.kept
        self._last_resync = now
        with self.ctx.store.read() as s:
            kept = self.follower.kept
            if kept is not None:
                self.follower.catch_up(s)
            fresh = read_all(s, self.ctx.config.server.policy)
        if kept is not None and fresh.last_change == kept.last_change:
            moved = differences(kept, fresh)
            if moved:
                log.warning("the kept cluster state differed from the store (%s); replaced", "; ".join(moved))
        self.follower.kept = fresh
        self.settled = None  # a new state counts its events afresh
        with self._write() as s:
            changes.trim(s, now - FEED_KEPT_SECONDS)
        del kept  # the replaced copy, freed before the collection that follows
        heap.settle(len(fresh.jobs))
        return fresh

    def cycle(self) -> None:
        """Requests first (cancel, admin hold), then a plan over a fresh snapshot, applied in order;
        no plan (nor snapshot) while the cluster is as the last plan, which only made jobs wait, left it
        (`Settled`)."""
        if self._handle_requests(self.read()):
            self.read()
        now, state = time.time(), self.follower.state
        settled = self.settled.holds(state, now) if self.settled is not None else None
        if settled is not None:
            self.settled = settled
            self.ctx.metrics.settled_cycles.inc()
            return
        view = self.follower.view()
        decisions = plan(view.snapshot, now)
        self.settled = Settled.after(decisions, state, now)
        suspends: list[Suspend] = []
        reserves: list[Reserve] = []
        admits: list[Admit] = []
        rejects: list[Reject] = []
        new_reasons: dict[int, str] = {}
        reasons = self.follower.reasons
        for d in decisions:
            if isinstance(d, Wait):
                if reasons.get(d.job_id) != d.reason:
                    new_reasons[d.job_id] = d.reason
            elif isinstance(d, Admit):
                admits.append(d)
            elif isinstance(d, Suspend):
                suspends.append(d)
            elif isinstance(d, Reserve):
                reserves.append(d)
            else:
                rejects.append(d)
        for d in suspends:
            self._suspend(view, d)
        stale = {r.job_id for r in view.snapshot.reservations} - {d.job_id for d in reserves}
        if stale:
            stale -= {j.id for j in view.snapshot.jobs if j.state in WAITING}
        news: list[admission.NewInstance] = []
        if reserves or stale or admits or new_reasons or rejects:
            # What the plan decided, in one transaction: reservations, reasons, rejections, claims.
            with self._write() as s:
                now = time.time()
                for d in reserves:
                    transitions.reserve(s, d.job_id, d.placement, now)
                if stale:
                    transitions.clear_reservations(s, sorted(stale))
                transitions.waiting_reasons(s, new_reasons)
                for r in rejects:
                    job = s.get(JobRow, r.job_id)
                    if job is not None and job.state in WAITING:
                        transitions.reject(s, job, r.reason, now)
                if admits:
                    news = self._claim(s, view, admits)
            for job_id, reason in new_reasons.items():
                # Kept as written: a reason is not a change the feed carries.
                view.jobs[job_id].reason = reason
                reasons[job_id] = reason
        if news:
            self.ctx.changed.notify()
            self._start(news)
        elif suspends or rejects:
            self.ctx.changed.notify()

    def _handle_requests(self, kept: Kept) -> bool:
        changed = False
        for job_id in sorted(kept.requests):
            row, inst = kept.jobs[job_id], kept.current.get(job_id)
            if row.cancel_requested:
                if row.state in WAITING:
                    with self._write() as s:
                        job = s.get(JobRow, row.id)
                        if job is not None and job.state in WAITING:
                            transitions.cancel_waiting(s, job, time.time())
                    changed = True
                elif row.state == "RUNNING" and inst is not None and inst.handle and inst.stop_kind is None:
                    self._stop(
                        row, inst, "cancel", CANCEL_GRACE_SECONDS, False, f"cancel asked by {row.cancel_by}"
                    )
                    changed = True
            elif (
                row.held
                and row.state == "RUNNING"
                and inst is not None
                and inst.handle
                and inst.stop_kind is None
            ):
                spec = parse_spec(row)
                reason = f"suspended by admin {row.held_by}"
                self._stop(row, inst, "hold", spec.effective_grace_seconds, spec.elastic, reason)
                changed = True
        if changed:
            self.ctx.changed.notify()
        return changed

    def _stop(
        self,
        row: JobRow,
        inst: InstanceRow,
        kind: str,
        grace: int,
        notice: bool,
        reason: str,
        preemptor: int | None = None,
    ) -> None:
        """Record the stop request, then ask the backend (re-asked after a restart if we die between)."""
        with self._write() as s:
            job, fresh = s.get(JobRow, row.id), s.get(InstanceRow, inst.id)
            if job is None or fresh is None or fresh.ended_at is not None or fresh.stop_kind is not None:
                return
            transitions.stopping(s, job, fresh, kind, grace, reason, time.time(), preemptor)
        self.backend.stop(inst.id, grace, notice)

    def _suspend(self, view: StoreView, d: Suspend) -> None:
        row, inst = view.jobs.get(d.job_id), view.current.get(d.job_id)
        if row is None or inst is None or row.state != "RUNNING" or not inst.handle or inst.stop_kind:
            return
        spec = parse_spec(row)
        self._stop(row, inst, "preempt", spec.effective_grace_seconds, spec.elastic, d.reason, d.preemptor_id)
        log.info("suspending job %d for job %d", d.job_id, d.preemptor_id)

    # ---- starting -----------------------------------------------------------------------------

    def _claim(self, s: Session, view: StoreView, admits: list[Admit]) -> list[admission.NewInstance]:
        """Claim the admitted jobs the view knows (`admission.claim`): their new instances."""
        known = [d for d in admits if d.job_id in view.jobs]
        rows = by_id.rows(s, JobRow, [d.job_id for d in known])
        wave = [(rows.get(d.job_id), parse_spec(view.jobs[d.job_id]), d) for d in known]
        return admission.claim(s, self.ctx, wave, self.me)

    def _start(self, news: list[admission.NewInstance]) -> None:
        """Launch the claimed instances, then record the outcomes in one transaction: a wave of starts
        costs two commits (with the claim's), not two per job."""
        started = [(new, *admission.launch(self.ctx, self.backend, new)) for new in news]
        try:
            with self._write() as s:
                now = time.time()
                for new, handle, failure in started:
                    # Only the controller moves a job's state, so the claimed rows are still as
                    # committed in what the outcome writes (a cancel or a hold sets other columns).
                    job, inst = new.rows
                    s.add_all(new.rows)
                    if handle is None:
                        transitions.start_failed(s, job, inst, failure or "unknown error", now)
                    else:
                        transitions.started(s, job, inst, handle, now)
        except lease.LeaseLost:
            for new, handle, _ in started:
                if handle is not None:
                    # Our successor will not know this instance: it must not run twice.
                    self.backend.stop(new.instance_id, 0, False)
            raise
        for new, handle, _ in started:
            if handle is not None:
                self.ctx.metrics.admitted(new.job.resume)
        self.ctx.changed.notify()

    # ---- checkpoints --------------------------------------------------------------------------

    def _checkpoint_of(self, user: str, group: str, inst: InstanceRow) -> Checkpoint | None:
        if not inst.model_dir:
            return None
        root = paths.watch_root(self.ctx.config, self.ctx.home, user, group, inst.job_id, inst.model_dir)
        if root is None:
            return None
        cfg = self.ctx.config.checkpoints
        # After a kill without grace, files written since the kill request may be half-written.
        cutoff = inst.stop_requested_at if inst.stop_kind and inst.grace_seconds == 0 else None
        return newest_checkpoint(Path(inst.model_dir), cfg.patterns, cfg.ignore, cutoff, beneath=root)

    def scan_checkpoints(self) -> None:
        """Show each running job's newest checkpoint on the job (passed to its next instance)."""
        with self.ctx.store.read() as s:
            rows = s.execute(
                select(
                    JobRow.id, JobRow.latest_checkpoint_at, JobRow.user_name, JobRow.group_name, InstanceRow
                )
                .join(InstanceRow, InstanceRow.id == JobRow.current_instance_id)
                .where(JobRow.state.in_(("RUNNING", "SUSPENDING")))
            ).all()
        found: dict[int, Checkpoint] = {}
        for job_id, latest_at, user, group, inst in rows:
            try:
                ckpt = self._checkpoint_of(user, group, inst)
            # one job's model dir (a race its owner runs, a hung mount) never stops the others' scan
            except Exception as e:
                log.warning("scanning job %s's model dir failed: %r", job_id, e)
                continue
            if ckpt is not None and (latest_at is None or ckpt.at > latest_at):
                found[job_id] = ckpt
        if not found:
            return
        with self._write() as s:
            now = time.time()
            for job_id, ckpt in found.items():
                job = s.get(JobRow, job_id)
                if job is not None and (
                    job.latest_checkpoint_at is None or ckpt.at > job.latest_checkpoint_at
                ):
                    transitions.checkpoint_seen(s, job, ckpt, now)
