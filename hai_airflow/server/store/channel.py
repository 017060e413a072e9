"""Wake-ups between `hai serve` processes on one PostgreSQL database: LISTEN/NOTIFY on one channel.

Inside a process the API wakes the controller and the controller wakes long-polls directly
(`notify.py`). Another process on the same database (a standby server whose API took a submit, the
leader whose controller started a job a standby's client waits on) learns of a commit here at once,
instead of on its next tick (`controller.TICK_SECONDS`, `routes.deps.DB_RECHECK_SECONDS`), which stay
as the fallback for a notification lost with a dropped connection.

A commit that recorded changes asks its store's `Announcer` to say so; the announcer sends one NOTIFY
(payload: the store's origin) from a thread of its own, so a writer never waits for it, and at most
one per `WINDOW_SECONDS`, so a stream of commits costs a few notifications a second, not one each
(PostgreSQL serializes committing transactions that notify), and only while another process listens
(looked up at most every `OTHERS_SECONDS`, and known at once when another's notification is heard), so
a lone server pays nothing. A `Listener` holds one connection, named after its store's origin, that
LISTENs, says hello on the channel (so the others know at once that it listens) and calls back on
every notification from another origin, and once after each (re)connect, for what it may have
missed meanwhile. SQLite has no such channel: servers sharing a SQLite file wake each other by their
ticks.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger("hai.server.channel")

CHANNEL = "hai_changes"
WINDOW_SECONDS = 0.02
"""Commits within this long of an announcement go out together in the next one."""
RECONNECT_SECONDS = 1.0
"""How long a listener whose connection failed waits before it connects again."""
WAIT_SECONDS = 0.5
"""How long a listener waits for notifications before it looks whether it should stop."""
OTHERS_SECONDS = 5.0
"""How long an announcer trusts its last look at whether another process listens."""
LISTENER_NAME = "hai-listener"

_SEND = text(f"SELECT pg_notify('{CHANNEL}', :origin)")
_OTHERS = text(
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND application_name LIKE :listeners AND application_name <> :mine"
)


def new_origin() -> str:
    """A name for one store's connections, so its own listener can skip what it announced."""
    return secrets.token_hex(8)


def listener_name(origin: str) -> str:
    """The application name of the listening connection of the store named `origin`."""
    return f"{LISTENER_NAME} {origin}"


class Announcer:
    """Tells the other processes on the database that this one committed changes."""

    def __init__(self, engine: Engine, origin: str) -> None:
        self.engine = engine
        self.origin = origin
        self.sent = 0
        self.quiet = 0
        """Announcements not sent because no other process listened."""
        self._others = False
        self._looked_at = -OTHERS_SECONDS
        self._due = False
        self._asked = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def heard_other(self) -> None:
        """Another process spoke on the channel, so it listens: announce to it."""
        self._others, self._looked_at = True, time.monotonic()

    def announce(self) -> None:
        """Called after a commit that recorded changes; returns at once."""
        if self._thread is None:
            with self._lock:
                if self._thread is None and not self._closed.is_set():
                    self._thread = threading.Thread(target=self._run, name="hai-announcer", daemon=True)
                    self._thread.start()
        self._due = True
        self._asked.set()

    def close(self) -> None:
        """Send what is due, then stop."""
        with self._lock:
            self._closed.set()
            thread, self._thread = self._thread, None
        self._asked.set()
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            self._asked.wait()
            self._asked.clear()
            if self._due:
                self._due = False
                self._send()
            if self._closed.is_set():
                return
            self._closed.wait(WINDOW_SECONDS)

    def _send(self) -> None:
        look = time.monotonic() - self._looked_at >= OTHERS_SECONDS
        if not look and not self._others:
            self.quiet += 1  # known alone: not even a connection from the pool
            return
        try:
            with self.engine.connect() as conn:
                if look:
                    mine = listener_name(self.origin)
                    found = conn.execute(_OTHERS, {"listeners": f"{LISTENER_NAME} %", "mine": mine}).scalar()
                    self._others, self._looked_at = bool(found), time.monotonic()
                if not self._others:
                    self.quiet += 1
                    return
                conn.execute(_SEND, {"origin": self.origin})
                conn.commit()
            self.sent += 1
        except SQLAlchemyError as exc:
            # The others still see the change on their next tick.
            log.warning("could not announce a change on %s: %s", CHANNEL, str(exc).splitlines()[0])


class Listener:
    """Calls `on_change` when another process announces a commit, and after every (re)connect."""

    def __init__(
        self,
        url: str,
        origin: str,
        on_change: Callable[[], None],
        on_other: Callable[[], None] | None = None,
    ) -> None:
        self.conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self.origin = origin
        self.on_change = on_change
        self.on_other = on_other
        """Called before `on_change` for a notification from another origin (the store's announcer)."""
        self.connects = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="hai-listener", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        # Here, not at the top: a server on SQLite never loads the PostgreSQL driver (~8 MB).
        import psycopg

        while not self._stopping.is_set():
            try:
                self._listen()
            except psycopg.Error as exc:
                log.warning("lost the %s channel (%s); listening again", CHANNEL, str(exc).splitlines()[0])
            self._stopping.wait(RECONNECT_SECONDS)

    def _listen(self) -> None:
        import psycopg

        name = listener_name(self.origin)
        with psycopg.connect(self.conninfo, autocommit=True, application_name=name) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, self.origin))  # hello
            self.connects += 1
            self.on_change()  # whatever was announced while nobody listened
            while not self._stopping.is_set():
                for note in conn.notifies(timeout=WAIT_SECONDS):
                    if note.payload != self.origin:
                        if self.on_other is not None:
                            self.on_other()
                        self.on_change()
