"""The controller lease: one row saying which `hai serve` may act on the store, and until when."""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import update
from sqlalchemy.orm import Session

from hai_airflow.server.store import clock
from hai_airflow.server.store.database import Store
from hai_airflow.server.store.tables import LeaseRow

LEASE_SECONDS = 10.0
RENEW_SECONDS = 2.0
"""How often a holder renews the lease when none of its writes did."""


class LeaseLost(Exception):
    """Another controller holds the lease now; this one must stop acting."""


def holder_identity() -> str:
    """host:pid:nonce, so a restarted server on the same host can tell its predecessor is gone."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def _dead_on_this_host(holder: str) -> bool:
    """The holder ran on this host in a process that no longer exists (e.g. after kill -9)."""
    host, _, rest = holder.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Watch:
    """How long the lease row has stayed as it is, by this server's monotonic clock. A holder that is
    alive renews it every RENEW_SECONDS at least; one that stopped leaves it as it was. Judging
    expiry by this rather than by the row's `expires_at`, no other server's clock enters: a server
    whose wall clock is minutes ahead does not take a live holder's lease."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._seen: tuple[str, float] | None = None
        self._since = 0.0

    def unchanged_for(self, row: LeaseRow) -> float:
        seen, now = (row.holder, row.expires_at), self._monotonic()
        if seen != self._seen:
            self._seen, self._since = seen, now
        return now - self._since


def try_acquire(
    session: Session, me: str, now: float, ttl: float = LEASE_SECONDS, watch: Watch | None = None
) -> bool:
    """Take the lease if it is ours, released, expired, or held by a dead process on this host; renew
    it if ours. Expired: unchanged for `ttl` by `watch`, or without one, `expires_at` before `now`."""
    return take(session, session.get(LeaseRow, 1, with_for_update=True), me, now, ttl, watch)


def take(
    session: Session, row: LeaseRow | None, me: str, now: float, ttl: float, watch: Watch | None
) -> bool:
    """`try_acquire` on the lease row its caller has read and locked (None: there is none yet)."""
    if row is None:
        session.add(LeaseRow(id=1, holder=me, expires_at=now + ttl, acquired_at=now))
        return True
    if row.holder != me and row.holder and row.expires_at > 0 and not _dead_on_this_host(row.holder):
        held = row.expires_at > now if watch is None else watch.unchanged_for(row) < ttl
        if held:
            return False
    if row.holder != me:
        row.acquired_at = now
    row.holder, row.expires_at = me, now + ttl
    return True


def renew(session: Session, me: str, now: float, ttl: float = LEASE_SECONDS) -> None:
    """Extend our lease inside a write transaction; raises `LeaseLost` if someone else took it.

    Every controller write goes through this, so the row lock fences a controller that
    stalled past its expiry from writing after a successor took over.
    """
    result = session.execute(
        update(LeaseRow).where(LeaseRow.id == 1, LeaseRow.holder == me).values(expires_at=now + ttl)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise LeaseLost(me)


def current(session: Session, now: float) -> LeaseRow | None:
    """The lease while someone holds it (not expired), else None."""
    row = session.get(LeaseRow, 1)
    return row if row is not None and row.holder and row.expires_at > now else None


def release(session: Session, me: str) -> None:
    session.execute(update(LeaseRow).where(LeaseRow.id == 1, LeaseRow.holder == me).values(expires_at=0.0))


class Holding:
    """This server's hold on the lease: taken when free, renewed while held, and renewed again by
    every write the controller makes (`write`), so a deposed controller cannot write."""

    def __init__(self, store: Store, me: str, seconds: float = LEASE_SECONDS) -> None:
        self.store = store
        self.me = me
        self.seconds = seconds
        self.last_renew = 0.0
        self.watch = Watch()

    def acquire(self, now: float) -> bool:
        """Take the lease if free; taking it over, this server's clock first moves up to the last
        write of the controller before it, so the times controllers write never go back."""
        with self.store.write() as s:
            row = s.get(LeaseRow, 1, with_for_update=True)
            if row is not None and row.holder != self.me:
                clock.CLOCK.not_before(row.expires_at - self.seconds)
                now = max(now, clock.now())
            got = take(s, row, self.me, now, self.seconds, self.watch)
        if got:
            self.last_renew = now
        return got

    def renew_if_due(self, now: float) -> None:
        if now - self.last_renew >= RENEW_SECONDS:
            with self.store.write() as s:
                renew(s, self.me, now, self.seconds)
            self.last_renew = now

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A write transaction that first renews the lease (LeaseLost when another server holds it)."""
        with self.store.write() as s:
            now = clock.now()
            renew(s, self.me, now, self.seconds)
            self.last_renew = now
            yield s

    def release(self) -> None:
        with self.store.write() as s:
            release(s, self.me)
