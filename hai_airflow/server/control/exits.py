"""Recording how instances ended: the job's next state, its last checkpoint, a hint at the failure.

The backend reports an exit once, so an exit is never dropped: one whose write fails is written again
at the next step. The retry ladder, one rung per failure: all the step's exits in one transaction;
else each in its own (a fault is that exit's alone); else that one without what its files gave
(checkpoint, failure hint: they may be what the store refused); else again next step, logged the
1st, 10th, 100th... time. An unusable store (`OperationalError`) fails them all at once and raises.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from hai_airflow.backends.common import log_files
from hai_airflow.backends.common.base import Exit
from hai_airflow.server.jobs import transitions
from hai_airflow.server.jobs.checkpoints import Checkpoint
from hai_airflow.server.jobs.hints import failure_hint
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.process.metrics import lost_gpu_seconds
from hai_airflow.server.store import clock, in_lists, lease
from hai_airflow.server.store.tables import InstanceRow, JobRow
from hai_airflow.spec import JobState

log = logging.getLogger("hai.server.controller")

HINT_LOG_LINES = 400
"""How much of a failed instance's log is read for a failure hint."""

Seen = tuple[Exit, Checkpoint | None, str | None]
"""An exit to record, with the newest checkpoint and the failure hint its instance's files gave."""
CheckpointOf = Callable[[str, str, InstanceRow], Checkpoint | None]
"""The newest checkpoint of an instance (user, group, instance): `CheckpointScanner.checkpoint_of`."""


class ExitRecorder:
    def __init__(
        self,
        ctx: ServerContext,
        write: Callable[[], AbstractContextManager[Session]],
        checkpoint_of: CheckpointOf,
    ) -> None:
        self.ctx = ctx
        self.write = write
        self.checkpoint_of = checkpoint_of
        self.unapplied: list[Exit] = []
        """Exits whose write failed (for want of the store, or for a fault of their own): written next."""
        self.failures: dict[int, int] = {}
        """Failed writes so far of each exit in `unapplied` that failed for a fault of its own."""

    def take(self, exits: list[Exit]) -> bool:
        """Record these exits and those not yet written; False when there were none."""
        exits = self.unapplied + exits
        if not exits:
            return False
        try:
            failed = self.record(exits)
        except OperationalError:
            self.unapplied = exits  # kept until the store takes them (a restart learns them again)
            raise
        self.failures = {ex.instance_id: self.failures.get(ex.instance_id, 0) + 1 for ex in failed}
        self.unapplied = failed
        return True

    def record(self, exits: list[Exit]) -> list[Exit]:
        """Record how instances ended, all in one write if it can be: a wave of jobs ends together (the
        local backend reports the exits it saw at once), so each costs statements, not transactions.
        Returns the exits not recorded."""
        with self.ctx.store.read() as s:
            insts, jobs = rows_of(s, exits)
        # What needs the file system comes before the transaction: newest checkpoints, failure hints.
        seen: list[Seen] = []
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
            final = self.checkpoint_of(job.user_name, job.group_name, inst)
            hint = None
            if not ex.lost and ex.exit_code not in (0, None) and inst.stop_kind is None:
                last = log_files.read_tail(Path(inst.log_path), HINT_LOG_LINES, home=self.ctx.home)
                hint = failure_hint(job.gpu_type, last)
        except Exception:
            log.exception(
                "reading the files of instance %d failed; its exit is recorded without them", inst.id
            )
            return None, None
        return final, hint

    def _write_exits(self, seen: list[Seen]) -> list[Exit]:
        """The ladder (see the module): returns the exits not written."""
        try:
            self._write_ended(seen)
        except (OperationalError, lease.LeaseLost):
            raise
        except Exception:
            if len(seen) > 1:
                return [ex for one in seen for ex in self._write_exits([one])]
            ex, final, hint = seen[0]
            failures = self.failures.get(ex.instance_id, 0)
            logged = failures == 0 or math.log10(failures).is_integer()
            if final is not None or hint is not None:
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

    def _write_ended(self, seen: list[Seen]) -> None:
        """One transaction for the exits: each one's checkpoint, the instance's end, the job's state."""
        ended: list[tuple[Exit, int, transitions.Outcome, float]] = []
        with self.write() as s:
            insts, jobs = rows_of(s, [ex for ex, _, _ in seen])
            now = clock.now()
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
                requeued = outcome.job_state == JobState.SUSPENDED
                lost = lost_gpu_seconds(job, inst, now) if requeued and not job.elastic else 0.0
                inst.lost_gpu_seconds = lost
                transitions.instance_ended(s, job, inst, ex, outcome, now)
                ended.append((ex, job.id, outcome, lost))
        for ex, job_id, outcome, lost in ended:
            self.ctx.metrics.instance_ended(outcome.end_reason, outcome.job_state == JobState.SUSPENDED, lost)
            log.info("instance %d of job %d ended: %s", ex.instance_id, job_id, outcome.reason)


def rows_of(s: Session, exits: list[Exit]) -> tuple[dict[int, InstanceRow], dict[int, JobRow]]:
    """The ended instances and their jobs, a query per table."""
    insts = in_lists.rows(s, InstanceRow, (ex.instance_id for ex in exits))
    return insts, in_lists.rows(s, JobRow, {i.job_id for i in insts.values()})
