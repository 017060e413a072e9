"""Carrying out what users asked and what the plan decided: cancels and admin holds, suspensions,
reservations, waiting reasons, rejections, claims and launches, each through `transitions`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace

from sqlalchemy.orm import Session

from hai_airflow import durations
from hai_airflow.backends.common.base import Backend
from hai_airflow.backends.local.backend import LocalBackend, unlisted_images
from hai_airflow.scheduling.model import Admit, Decision, Grow, Reject, Reserve, Shrink, Suspend, Wait
from hai_airflow.scheduling.resize import resizing
from hai_airflow.server.control import admission, carryover
from hai_airflow.server.control.admission import parse_spec
from hai_airflow.server.control.mirror import Kept
from hai_airflow.server.jobs import transitions
from hai_airflow.server.jobs.dependencies import verdict, waited_tasks, waits_over, within_slots
from hai_airflow.server.jobs.holds import held_by
from hai_airflow.server.jobs.kept import KeptInstance, KeptJob
from hai_airflow.server.jobs.snapshot import StoreView
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.store import clock, in_lists, lease, tokens
from hai_airflow.server.store.tables import InstanceRow, JobRow
from hai_airflow.spec import WAITING, JobState, StopKind, stop_order

log = logging.getLogger("hai.server.controller")
LOCAL_BACKEND = "local"

CANCEL_GRACE_SECONDS = 3
"""How long a cancelled running job has to exit before it is killed."""


@dataclass
class Decided:
    """A plan's decisions by kind; waits only where their reason changed."""

    suspends: list[Suspend] = field(default_factory=list)
    resizes: list[Shrink | Grow] = field(default_factory=list)
    reserves: list[Reserve] = field(default_factory=list)
    admits: list[Admit] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    reasons: dict[int, str] = field(default_factory=dict)

    @classmethod
    def sort(cls, decisions: list[Decision], jobs: Mapping[int, KeptJob]) -> Decided:
        d = cls()
        for x in decisions:
            if isinstance(x, Wait):
                if _reason(jobs, x.job_id) != x.reason:
                    d.reasons[x.job_id] = x.reason
            elif isinstance(x, Admit):
                d.admits.append(x)
            elif isinstance(x, Suspend):
                d.suspends.append(x)
            elif isinstance(x, Shrink | Grow):
                d.resizes.append(x)
            elif isinstance(x, Reserve):
                d.reserves.append(x)
            else:
                d.rejects.append(x)
        return d

    def hold_admits(self, reason: str, jobs: Mapping[int, KeptJob]) -> None:
        """Start none of the admitted jobs now: they wait, saying why."""
        for a in self.admits:
            if _reason(jobs, a.job_id) != reason:
                self.reasons[a.job_id] = reason
        self.admits = []


def job_server(ctx: ServerContext, backend: str) -> str | None:
    """`HAI_SERVER` of the jobs `backend` starts: the address this server listens on (as loopback when
    it listens on every interface) for a local job, which runs on this machine; `[server] job_url` for
    a container's or a pod's, None while the admin has not set it (the job then has no HAI_SERVER)."""
    if backend == LOCAL_BACKEND:
        return ctx.listen_url
    return ctx.config.server.job_url


def _reason(jobs: Mapping[int, KeptJob], job_id: int) -> str | None:
    """Why the job waits, as stored (None for a job not kept)."""
    job = jobs.get(job_id)
    return None if job is None else job.reason


class PlanApplier:
    def __init__(
        self, ctx: ServerContext, backend: Backend, write: Callable[[], AbstractContextManager[Session]]
    ) -> None:
        self.ctx = ctx
        self.backend = backend
        self.write = write

    # ---- requests -----------------------------------------------------------------------------

    def requests(self, kept: Kept) -> bool:
        """Cancels and admin holds asked since the last cycle; True when one changed a job."""
        changed = False
        for job_id in sorted(kept.requests):
            row, inst = kept.jobs[job_id], kept.current.get(job_id)
            running = row.state == JobState.RUNNING and inst and inst.handle and inst.stop_kind is None
            if row.cancel_requested and row.state in WAITING:
                with self.write() as s:
                    job = s.get(JobRow, row.id)
                    if job is not None and job.state in WAITING:
                        transitions.cancel_waiting(s, job, clock.now())
                changed = True
            elif row.cancel_requested and running and inst is not None:
                reason = f"cancel asked by {row.cancel_by}"
                self._stop(row, inst, StopKind.CANCEL, CANCEL_GRACE_SECONDS, False, reason)
                changed = True
            elif not row.cancel_requested and row.held and running and inst is not None:
                spec = parse_spec(row)
                self._stop(row, inst, StopKind.HOLD, self._grace(spec), spec.elastic, held_by(row))
                changed = True
        if changed:
            self.ctx.changed.notify()
        return changed

    def expire(self, kept: Kept, now: float) -> bool:
        """Jobs that used up their time limit: a running one is stopped with the notice and its grace
        (it ends TIMEOUT when its instance does), a suspended one ends TIMEOUT where it waits. True
        when one changed."""
        changed = False
        for job_id in sorted(kept.limited):
            row, inst = kept.jobs[job_id], kept.current.get(job_id)
            limit = row.time_limit_seconds
            if limit is None or row.seconds_run(inst, now) < limit:
                continue
            if row.state == JobState.RUNNING and inst is not None and inst.handle and inst.stop_kind is None:
                spec = parse_spec(row)
                reason = f"reached its time limit of {durations.text(limit)}"
                self._stop(row, inst, StopKind.TIMEOUT, self._grace(spec), spec.elastic, reason)
                changed = True
            elif row.state == JobState.SUSPENDED:
                with self.write() as s:
                    job = s.get(JobRow, row.id)
                    if job is not None and job.state == JobState.SUSPENDED:
                        transitions.time_out_waiting(s, job, now)
                changed = True
        if changed:
            self.ctx.changed.notify()
        return changed

    def release(self, kept: Kept, now: float) -> bool:
        """Jobs waiting for others whose wait is over: released to the planner, or cancelled when a job
        that had to succeed did not (`dependencies.verdict`). True when one changed."""
        ready = within_slots(waits_over(kept.blocked, kept.jobs), kept.blocked, kept.jobs)
        if not ready:
            return False
        with self.write() as s:
            waited = waited_tasks(s, {i for j in ready for i in kept.blocked[j].ids})
            for job_id in sorted(ready):
                job = s.get(JobRow, job_id)
                decided = verdict(kept.blocked[job_id], waited.states, waited.tasks)
                if job is None or decided is None or not job.blocked or job.state != JobState.PENDING:
                    continue
                job.blocked = False
                if decided.release:
                    transitions.event(s, job, "released", decided.reason, now)
                    job.reason = decided.reason
                else:
                    transitions.move(s, job, JobState.CANCELLED, "cancelled", decided.reason, now)
        self.ctx.changed.notify()
        return True

    def _grace(self, spec: admission.AnySpec) -> int:
        """The grace this job's instance gets after the notice (`admission.granted_grace`)."""
        return admission.granted_grace(spec, self.ctx.config.limits.max_grace_seconds)

    def _stop(
        self,
        row: KeptJob,
        inst: KeptInstance,
        kind: StopKind,
        grace: int,
        elastic: bool,
        reason: str,
        preemptor: int | None = None,
    ) -> None:
        """Record the stop request, then ask the backend as `stop_order` says (asked again the same way
        after a restart if we die between)."""
        with self.write() as s:
            job, fresh = s.get(JobRow, row.id), s.get(InstanceRow, inst.id)
            if job is None or fresh is None or fresh.ended_at is not None or fresh.stop_kind is not None:
                return
            now = clock.now()
            transitions.stopping(s, job, fresh, kind, grace, reason, now, preemptor)
        order = stop_order(kind, elastic, grace, now, now)
        self.backend.stop(inst.id, order.grace_seconds, order.notice)

    # ---- a plan -------------------------------------------------------------------------------

    def apply(self, view: StoreView, decisions: list[Decision], kept: Kept) -> None:
        """Suspensions first, then what the plan decided in one transaction, then the launches; the
        waiting reasons written are kept in `kept`, which `view` was taken from."""
        d = Decided.sort(decisions, kept.jobs)
        if d.admits and (full := admission.no_room(self.ctx.home)) is not None:
            d.hold_admits(full, kept.jobs)
        for s in d.suspends:
            self._suspend(view, s)
        for r in d.resizes:
            self._resize(view, r)
        stale = {r.job_id for r in view.snapshot.reservations} - {r.job_id for r in d.reserves}
        if stale:
            stale -= {j.id for j in view.snapshot.jobs if j.state in WAITING or resizing(j)}
        news: list[admission.NewInstance] = []
        if d.reserves or stale or d.admits or d.reasons or d.rejects:
            news = self._write_decided(view, d, stale)
            for job_id, reason in d.reasons.items():
                kept.reason_written(job_id, reason)
        if news:
            self.ctx.changed.notify()
            self._start(news)
        elif d.suspends or d.resizes or d.rejects:
            self.ctx.changed.notify()

    def _write_decided(self, view: StoreView, d: Decided, stale: set[int]) -> list[admission.NewInstance]:
        """Reservations, reasons, rejections and claims in one transaction; the claimed instances."""
        with self.write() as s:
            now = clock.now()
            for r in d.reserves:
                transitions.reserve(s, r.job_id, r.placement, now)
            if stale:
                transitions.clear_reservations(s, sorted(stale))
            transitions.waiting_reasons(s, d.reasons)
            for x in d.rejects:
                job = s.get(JobRow, x.job_id)
                if job is not None and job.state in WAITING:
                    transitions.reject(s, job, x.reason, now)
            return self._claim(s, view, d.admits) if d.admits else []

    def _suspend(self, view: StoreView, d: Suspend) -> None:
        row, inst = view.jobs.get(d.job_id), view.current.get(d.job_id)
        if row is None or inst is None or row.state != JobState.RUNNING or not inst.handle or inst.stop_kind:
            return
        spec = parse_spec(row)
        self._stop(row, inst, StopKind.PREEMPT, self._grace(spec), spec.elastic, d.reason, d.preemptor_id)
        log.info("suspending job %d for job %d", d.job_id, d.preemptor_id)

    def _resize(self, view: StoreView, d: Shrink | Grow) -> None:
        """Restart a resizable job at its new size: the size, its GPUs held and the stop in one write,
        then the notice (it saves and exits; the next cycle starts it on the held GPUs)."""
        row, inst = view.jobs.get(d.job_id), view.current.get(d.job_id)
        if row is None or inst is None or row.state != JobState.RUNNING or not inst.handle or inst.stop_kind:
            return
        spec = parse_spec(row)
        grace = self._grace(spec)
        with self.write() as s:
            job, fresh = s.get(JobRow, row.id), s.get(InstanceRow, inst.id)
            if job is None or fresh is None or fresh.ended_at is not None or fresh.stop_kind is not None:
                return
            now = clock.now()
            transitions.resize(s, job, fresh, d.to, d.placement, grace, d.reason, now)
        order = stop_order(StopKind.RESIZE, spec.elastic, grace, now, now)
        self.backend.stop(inst.id, order.grace_seconds, order.notice)
        preemptor = f" for job {d.preemptor_id}" if isinstance(d, Shrink) else ""
        log.info("resizing job %d to %d workers%s", d.job_id, d.to, preemptor)

    # ---- starting -----------------------------------------------------------------------------

    def _claim(self, s: Session, view: StoreView, admits: list[Admit]) -> list[admission.NewInstance]:
        """Claim the admitted jobs the view knows (`admission.claim`): their new instances, each with
        its job credential (its hash committed with the claim) and the server's address for jobs."""
        known = [d for d in admits if d.job_id in view.jobs]
        rows = in_lists.rows(s, JobRow, [d.job_id for d in known])
        wave = [(rows.get(d.job_id), parse_spec(view.jobs[d.job_id]), d) for d in known]
        news = admission.claim(s, self.ctx, wave, self.ctx.holder_id)
        server = job_server(self.ctx, self.backend.name)
        return [self._credited(s, new, server) for new in news]

    def _credited(self, s: Session, new: admission.NewInstance, server: str | None) -> admission.NewInstance:
        """The new instance with a fresh job credential: the store keeps its keyed hash on the instance
        row (in the claim's own session), the launch carries the token to the backend, and nothing
        else ever sees it."""
        token = tokens.new_token()
        inst = s.get(InstanceRow, new.instance_id)  # the claim's own row, from the session's map
        assert inst is not None
        inst.credential_hash = tokens.token_hash(self.ctx.store.token_key, token)
        return replace(new, job=replace(new.job, server=server, credential=token))

    def _start(self, news: list[admission.NewInstance]) -> None:
        """Launch the claimed instances, then record the outcomes in one transaction: a wave of starts
        costs two commits (with the claim's), not two per job."""
        news, notes = carryover.carried_over(self.ctx, news)
        for new in news:
            if (note := unused_image(self.backend, new.spec)) is not None:
                notes.setdefault(new.instance_id, []).append(note)
        started = [(new, *admission.launch(self.ctx, self.backend, new)) for new in news]
        try:
            with self.write() as s:
                now = clock.now()
                jobs = in_lists.rows(s, JobRow, [new.job_id for new, _, _ in started])
                insts = in_lists.rows(s, InstanceRow, [new.instance_id for new, _, _ in started])
                for new, handle, failure in started:
                    # Read in this session: only the controller moves a job's state, so each job is
                    # still STARTING as the claim left it (a cancel or a hold sets other columns).
                    job, inst = jobs[new.job_id], insts[new.instance_id]
                    if new.carried_checkpoint is not None:
                        job.latest_checkpoint = inst.checkpoint = new.carried_checkpoint
                    for note in notes.get(new.instance_id, ()):
                        transitions.event(s, job, "note", note, now)
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


def unused_image(backend: Backend, spec: admission.AnySpec) -> str | None:
    """The note for a job naming an image the local backend has no environment for: the same question
    the submit's refusal asks (`unlisted_images`)."""
    if not isinstance(backend, LocalBackend):
        return None
    images = unlisted_images(backend.options, [spec.image, getattr(spec, "worker_image", None)])
    if not images:
        return None
    return f"the local backend runs commands on this machine; image {', '.join(images)} is not used"
