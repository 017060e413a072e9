"""The cluster state as the controller keeps it: the change feed applied since the last cycle, and a
full read of the store every few minutes as a safety net, whose differences are an alarm."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager

from sqlalchemy.orm import Session

from hai_airflow.server.control import gc_freeze
from hai_airflow.server.control.mirror import Kept, StoreFollower, differences, read_all
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.store import changes, clock

log = logging.getLogger("hai.server.controller")

RESYNC_SECONDS = 300.0
"""How often the kept copy of the store is checked against a full read (and replaced by it)."""
FEED_KEPT_SECONDS = 3600.0
"""How long change-feed rows are kept (a controller taking over reads the store whole)."""


class Keeper:
    def __init__(self, ctx: ServerContext, write: Callable[[], AbstractContextManager[Session]]) -> None:
        self.ctx = ctx
        self.write = write
        self.follower = StoreFollower(ctx.config.server.policy)
        self.last_resync = 0.0
        """When the store was last read whole; 0 makes the next read whole (on taking the lease)."""

    def forget(self) -> None:
        """After a failed step: the kept copy may hold a feed half applied, so the next read is whole."""
        self.follower.kept = None
        self.last_resync = 0.0

    def read(self) -> tuple[Kept, bool]:
        """The store as kept, and whether it was read whole just now (every RESYNC_SECONDS, and at
        first): then a difference from the kept copy is counted (`kept_state_drifts`) and logged."""
        now = clock.now()
        if now - self.last_resync < RESYNC_SECONDS and self.follower.kept is not None:
            with self.ctx.store.read() as s:
                self.follower.catch_up(s)
            return self.follower.kept, False
        self.last_resync = now
        with self.ctx.store.read() as s:
            kept = self.follower.kept
            if kept is not None:
                self.follower.catch_up(s)
            fresh = read_all(s, self.ctx.config.server.policy)
        if kept is not None and fresh.last_change == kept.last_change:
            moved = differences(kept, fresh)
            if moved:
                self.ctx.metrics.kept_state_drifts.inc()
                log.warning("the kept cluster state differed from the store (%s); replaced", "; ".join(moved))
        self.follower.kept = fresh
        with self.write() as s:
            changes.trim(s, now - FEED_KEPT_SECONDS)
        del kept  # the replaced copy, freed before the collection that follows
        gc_freeze.settle(len(fresh.jobs))
        return fresh, True
