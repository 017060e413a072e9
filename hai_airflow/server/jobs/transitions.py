"""Job and instance state changes as store writes; each records an event with its reason."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import delete, update
from sqlalchemy.orm import Session

from hai_airflow import durations
from hai_airflow.backends.common.base import Exit, Handle
from hai_airflow.scheduling.model import Placement
from hai_airflow.server.jobs.checkpoints import Checkpoint
from hai_airflow.server.jobs.holds import hold_reason
from hai_airflow.server.jobs.snapshot import placement_to_json
from hai_airflow.server.store import changes, in_lists
from hai_airflow.server.store.tables import EventRow, InstanceRow, JobRow, ReservationRow
from hai_airflow.spec import TERMINAL_STATES, WAITING, JobState, StopKind, checked_move
from hai_airflow.spec import IllegalMove as IllegalMove  # what `move` raises
from hai_airflow.training.preemption import EXIT_SAVED_ON_NOTICE

CONTROLLER = "controller"


def move(
    s: Session, job: JobRow, to_state: JobState, kind: str, reason: str, now: float, actor: str = CONTROLLER
) -> None:
    """Change the job's state and record why, in one go; IllegalMove for a move `MOVES` does not
    list. A job that leaves the queue for good drops its reservation: only waiting jobs hold one
    (`begin_instances` drops those of the jobs it starts), so a job that ends after running has none
    to drop and costs no statement for it."""
    checked_move(job.id, job.state, to_state, kind)
    changes.jobs_changed(s, [job.id])
    leaves_queue = job.state in WAITING
    now = event(s, job, kind, reason, now, to_state, actor)
    job.state = to_state
    job.reason = reason
    if to_state in TERMINAL_STATES:
        job.ended_at = now
        job.current_instance_id = None
        if leaves_queue:
            clear_reservations(s, [job.id])


def event(
    s: Session,
    job: JobRow,
    kind: str,
    reason: str,
    now: float,
    to_state: JobState | None = None,
    actor: str = CONTROLLER,
) -> float:
    """Record what happened to the job and why; without `to_state`, the job stays where it is.

    Dated `now`, or the job's newest event's time if that is later: events written by servers whose
    clocks differ a little still follow each other. Returns the date it got."""
    at = max(now, job.last_event_at or 0.0)
    job.last_event_at = at
    s.add(
        EventRow(
            job_id=job.id,
            at=at,
            kind=kind,
            from_state=job.state,
            to_state=job.state if to_state is None else to_state,
            reason=reason,
            actor=actor,
        )
    )
    return at


def clear_reservations(s: Session, job_ids: Iterable[int]) -> None:
    for part in in_lists.chunks(job_ids):
        changes.jobs_changed(s, part)
        s.execute(delete(ReservationRow).where(ReservationRow.job_id.in_(part)))


def resize(
    s: Session, job: JobRow, inst: InstanceRow, to: int, placement: Placement, grace: int, reason: str,
    now: float,
) -> None:
    """A resizable job restarts at `to` workers: its new size, the GPUs it comes back on held for it,
    and the stop with the notice (it saves, exits, and is started again on them), in one write."""
    job.size = to
    reserve(s, job.id, placement, now)
    stopping(s, job, inst, StopKind.RESIZE, grace, reason, now)


def reserve(s: Session, job_id: int, placement: Placement, now: float) -> None:
    clear_reservations(s, [job_id])
    for w in placement:
        s.add(ReservationRow(job_id=job_id, node=w.node, gpus=json.dumps(list(w.gpus)), created_at=now))


@dataclass(frozen=True)
class Start:
    """A waiting job the controller admits: where it goes, and what its new instance resumes from."""

    job: JobRow
    placement: Placement
    resume: bool
    checkpoint: str | None
    reason: str


def begin_instances(s: Session, starts: list[Start], now: float, controller: str) -> list[InstanceRow]:
    """PENDING/SUSPENDED -> STARTING, each with a new instance row (paths are filled in by the caller).
    A wave of starts is one INSERT of the instance rows and one DELETE of the reservations they used."""
    instances = [
        InstanceRow(
            job_id=start.job.id,
            created_at=now,
            placement=placement_to_json(start.placement),
            gpus=sum(len(w.gpus) for w in start.placement),
            resume=start.resume,
            checkpoint=start.checkpoint,
            log_path="",
            work_dir="",
            model_dir="",
            grace_seconds=0,
            controller=controller,
        )
        for start in starts
    ]
    s.add_all(instances)
    s.flush()
    clear_reservations(s, [start.job.id for start in starts])
    for start, inst in zip(starts, instances, strict=True):
        job = start.job
        if job.state == JobState.SUSPENDED and job.suspended_at is not None:
            job.suspended_seconds += max(0.0, now - job.suspended_at)
        job.suspended_at = None
        job.current_instance_id = inst.id
        job.instance_count += 1
        move(s, job, JobState.STARTING, "admitted", f"instance {inst.id}: {start.reason}", now)
    return instances


def started(s: Session, job: JobRow, inst: InstanceRow, handle: Handle, now: float) -> None:
    data = dict(handle.data)
    inst.handle = json.dumps(data)
    inst.pid = _first_pid(data)
    inst.started_at = now
    job.started_at = now
    how = (
        f"resumed from {inst.checkpoint}"
        if inst.resume and inst.checkpoint
        else ("resumed (no checkpoint yet)" if inst.resume else "started")
    )
    move(s, job, JobState.RUNNING, "started", f"instance {inst.id} {how}", now)


def _first_pid(data: dict[str, object]) -> int | None:
    workers = data.get("workers")
    if isinstance(workers, list) and workers and isinstance(workers[0], dict):
        pid = workers[0].get("pid")
        return pid if isinstance(pid, int) else None
    pid = data.get("pid")
    return pid if isinstance(pid, int) else None


def start_failed(s: Session, job: JobRow, inst: InstanceRow, message: str, now: float) -> None:
    inst.ended_at, inst.end_reason = now, "failed"
    move(s, job, JobState.FAILED, "start_failed", f"could not start instance {inst.id}: {message}", now)


def stopping(
    s: Session,
    job: JobRow,
    inst: InstanceRow,
    kind: StopKind,
    grace: int,
    reason: str,
    now: float,
    preemptor: int | None = None,
) -> None:
    """Record that the controller asked the instance to stop: preempt, resize, hold (admin), cancel or
    timeout. A job cancelled or out of time stays RUNNING until its instance ends: it is not coming back."""
    inst.stop_kind, inst.stop_requested_at, inst.grace_seconds = kind, now, grace
    inst.preempted_by = preemptor
    if kind in (StopKind.CANCEL, StopKind.TIMEOUT):
        event(s, job, "stopping", reason, now)
    elif kind is StopKind.RESIZE:
        move(s, job, JobState.SUSPENDING, "resizing", reason, now)
    else:
        move(s, job, JobState.SUSPENDING, "suspending", reason, now)


@dataclass(frozen=True)
class Outcome:
    end_reason: str
    job_state: JobState
    kind: str
    reason: str


def exit_outcome(job: JobRow, inst: InstanceRow, ex: Exit, hint: str | None = None) -> Outcome:
    """How an instance's end moves its job. A stop the controller asked for wins over the exit code:
    an exit during the grace period is a clean suspension, not a failure."""
    code = "no exit code" if ex.exit_code is None else f"exit code {ex.exit_code}"
    if job.cancel_requested or inst.stop_kind == StopKind.CANCEL:
        by = job.cancel_by or "an admin"
        return Outcome("cancelled", JobState.CANCELLED, "cancelled", f"cancelled by {by}")
    if inst.stop_kind == StopKind.TIMEOUT and ex.exit_code != 0:
        return Outcome("timeout", JobState.TIMEOUT, "timeout", timed_out(job))
    if inst.stop_kind == StopKind.PREEMPT:
        by = f"job {inst.preempted_by}" if inst.preempted_by else "a high-priority job"
        return Outcome(
            "preempted",
            JobState.SUSPENDED,
            "suspended",
            f"preempted by {by}; resumes from its latest checkpoint when GPUs free up",
        )
    if inst.stop_kind == StopKind.RESIZE:
        return Outcome(
            "resized",
            JobState.SUSPENDED,
            "resized",
            f"saved to restart at {job.current_workers} of its {job.workers} workers; it resumes from "
            "that checkpoint on GPUs held for it",
        )
    if inst.stop_kind == StopKind.HOLD:
        return Outcome(
            "suspended",
            JobState.SUSPENDED,
            "suspended",
            hold_reason(job),
        )
    if ex.lost:
        return Outcome(
            "lost",
            JobState.SUSPENDED,
            "lost",
            f"instance {inst.id} was lost ({ex.reason}); it resumes from its latest checkpoint",
        )
    if ex.exit_code == EXIT_SAVED_ON_NOTICE:
        # Nobody here asked, but someone did (a node drain's SIGTERM, an operator): the job saved its
        # progress and wants to go on, so it waits for GPUs like a preempted job instead of failing.
        return Outcome(
            "suspended",
            JobState.SUSPENDED,
            "suspended",
            f"the job saved and asked to be resumed (exit {EXIT_SAVED_ON_NOTICE})",
        )
    if ex.exit_code == 0:
        return Outcome("completed", JobState.SUCCEEDED, "succeeded", "completed (exit code 0)")
    reason = f"{code}: {ex.reason}" if ex.reason and ex.reason != code else code
    if hint:
        reason += f". {hint}"
    return Outcome("failed", JobState.FAILED, "failed", reason)


def instance_ended(
    s: Session, job: JobRow, inst: InstanceRow, ex: Exit, outcome: Outcome, now: float
) -> None:
    """The instance's end and the job's move; a job still STARTING had its start go unrecorded (the
    store failed between the launch and its write) and is recorded RUNNING first, so its history
    stays whole."""
    if job.state == JobState.STARTING:
        inst.started_at = job.started_at = inst.created_at
        late = f"instance {inst.id} ran (its start recorded at its end)"
        move(s, job, JobState.RUNNING, "started", late, now)
    inst.ended_at, inst.exit_code, inst.end_reason = now, ex.exit_code, outcome.end_reason
    if inst.started_at is not None:
        job.runtime_seconds += max(0.0, now - inst.started_at)
    if job.current_instance_id == inst.id:
        job.current_instance_id = None
    if outcome.job_state == JobState.SUSPENDED:
        job.suspended_at = now
        if outcome.end_reason == "preempted":
            job.preemptions += 1
    move(s, job, outcome.job_state, outcome.kind, f"instance {inst.id}: {outcome.reason}", now)
    job.reason = outcome.reason


def timed_out(job: JobRow) -> str:
    """Why a job ended TIMEOUT."""
    limit = durations.text(job.time_limit_seconds or 0)
    return f"reached its time limit of {limit}; `hai requeue {job.id}` runs it again from its checkpoint"


def time_out_waiting(s: Session, job: JobRow, now: float) -> None:
    """A suspended job that used up its time while its instance was being stopped ends where it waits."""
    move(s, job, JobState.TIMEOUT, "timeout", timed_out(job), now)


def cancel_waiting(s: Session, job: JobRow, now: float) -> None:
    move(
        s,
        job,
        JobState.CANCELLED,
        "cancelled",
        f"cancelled by {job.cancel_by or 'an admin'} before it ran again",
        now,
    )


def waiting_reasons(s: Session, reasons: dict[int, str]) -> None:
    """Say why each waiting job waits (not a state change, so no event). A queue behind a full
    cluster shares a handful of reasons, so it is one UPDATE per reason, not one per job."""
    by_reason: dict[str, list[int]] = {}
    for job_id, reason in reasons.items():
        by_reason.setdefault(reason, []).append(job_id)
    for reason, ids in by_reason.items():
        for part in in_lists.chunks(ids):
            changes.jobs_changed(s, part, feed=False)  # the controller keeps what it wrote
            s.execute(
                update(JobRow)
                .where(JobRow.id.in_(part), JobRow.state.in_(WAITING))
                .values(reason=reason)
                .execution_options(synchronize_session=False)
            )


def reject(s: Session, job: JobRow, reason: str, now: float) -> None:
    move(s, job, JobState.FAILED, "rejected", f"cannot run on this cluster: {reason}", now)


def checkpoint_seen(s: Session, job: JobRow, ckpt: Checkpoint, now: float) -> None:
    job.latest_checkpoint, job.latest_checkpoint_at = ckpt.path, ckpt.at
    event(s, job, "checkpoint", f"latest checkpoint {ckpt.path}", now)
