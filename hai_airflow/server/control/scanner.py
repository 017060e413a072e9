"""The checkpoint scanner: each running job's newest checkpoint, shown on the job and passed to its
next instance, found by looking at the model dirs now and then, never holding up the cycles."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from hai_airflow.server.jobs import paths, transitions
from hai_airflow.server.jobs.checkpoints import Checkpoint, Counted, newest_checkpoint
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.store import clock
from hai_airflow.server.store.tables import InstanceRow, JobRow
from hai_airflow.spec import LIVE

log = logging.getLogger("hai.server.controller")

CHECKPOINT_SCAN_SECONDS = 2.0
"""How often the running jobs' model dirs are scanned for a newer checkpoint, at most."""
SCAN_SHARE = 0.1
"""And no more than this share of the controller's time: a scan that took t seconds (a thousand
running jobs' dirs) waits t / SCAN_SHARE for the next, so cycles are not held up behind scans."""


class CheckpointScanner:
    def __init__(self, ctx: ServerContext, write: Callable[[], AbstractContextManager[Session]]) -> None:
        self.ctx = ctx
        self.write = write
        self.last_scan = 0.0
        self.every = CHECKPOINT_SCAN_SECONDS

    def scan_if_due(self, now: float) -> None:
        if now - self.last_scan < self.every:
            return
        self.last_scan = now
        started = time.monotonic()
        self.scan()
        took = time.monotonic() - started
        self.every = max(CHECKPOINT_SCAN_SECONDS, took / SCAN_SHARE)

    def checkpoint_of(self, user: str, group: str, inst: InstanceRow) -> Checkpoint | None:
        """The newest checkpoint in the instance's model dir, looked for only beneath the root the
        job may write (`paths.watch_root`)."""
        if not inst.model_dir:
            return None
        root = paths.watch_root(self.ctx.config, self.ctx.home, user, group, inst.job_id, inst.model_dir)
        if root is None:
            return None
        cfg = self.ctx.config.checkpoints
        # No cutoff at a kill: a file saved between the kill request and the kill, under its final
        # name, is complete (a save in progress bears a temp name), and the job resumes from it.
        counted = Counted(cfg.patterns, cfg.ignore, cfg.directories)
        return newest_checkpoint(Path(inst.model_dir), counted, beneath=root)

    def scan(self) -> None:
        """Show each running job's newest checkpoint on the job (passed to its next instance)."""
        with self.ctx.store.read() as s:
            rows = s.execute(
                select(
                    JobRow.id, JobRow.latest_checkpoint_at, JobRow.user_name, JobRow.group_name, InstanceRow
                )
                .join(InstanceRow, InstanceRow.id == JobRow.current_instance_id)
                .where(JobRow.state.in_(LIVE))
            ).all()
        found: dict[int, Checkpoint] = {}
        for job_id, latest_at, user, group, inst in rows:
            try:
                ckpt = self.checkpoint_of(user, group, inst)
            # one job's model dir (a race its owner runs, a hung mount) never stops the others' scan
            except Exception as e:
                log.warning("scanning job %s's model dir failed: %r", job_id, e)
                continue
            if ckpt is not None and (latest_at is None or ckpt.at > latest_at):
                found[job_id] = ckpt
        if not found:
            return
        with self.write() as s:
            now = clock.now()
            for job_id, ckpt in found.items():
                job = s.get(JobRow, job_id)
                if job is not None and (
                    job.latest_checkpoint_at is None or ckpt.at > job.latest_checkpoint_at
                ):
                    transitions.checkpoint_seen(s, job, ckpt, now)
