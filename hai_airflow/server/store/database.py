"""The database: engine setup for SQLite and PostgreSQL, migrations, read and write transactions."""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

from hai_airflow.server.store import changes
from hai_airflow.server.store.channel import Announcer, Listener, new_origin

MIGRATIONS = Path(__file__).parent / "migrations"
_MIGRATION_LOCK_KEY = 0x4841_4953  # "HAIS": one PostgreSQL advisory lock for schema upgrades
SQLITE_BUSY_TIMEOUT_MS = 30_000
_NEXT_JOB_IDS = text("SELECT nextval(pg_get_serial_sequence('jobs', 'id')) FROM generate_series(1, :n)")


def database_url(configured: str | None, home: Path) -> str:
    """HAI_DATABASE_URL first, then the config's `[server] database_url`, then SQLite under $HAI_HOME."""
    return os.environ.get("HAI_DATABASE_URL") or configured or f"sqlite:///{home / 'hai.db'}"


def _sqlite_engine(url: str) -> Engine:
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
    )

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        # We issue BEGIN ourselves (below), so the driver must not open transactions behind our back.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        # A writer takes the write lock up front: upgrading a read transaction to a write one
        # fails at once with "database is locked" instead of waiting out the busy timeout.
        write = conn.get_execution_options().get("hai_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


PRIVATE_FILE_MODE = 0o600
SQLITE_SIDE_FILES = ("", "-wal", "-shm", "-journal")


def sqlite_path(url: str) -> Path | None:
    """The database file of a SQLite URL; None for other databases and in-memory ones."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def make_private(database: Path) -> None:
    """Create the SQLite file 0600 before SQLite does (its -wal and -shm copy its mode); tighten old ones."""
    database.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(database, os.O_RDWR | os.O_CREAT, PRIVATE_FILE_MODE))
    for suffix in SQLITE_SIDE_FILES:
        path = database.with_name(database.name + suffix)
        try:
            if path.stat().st_mode & 0o077:
                path.chmod(PRIVATE_FILE_MODE)
        except FileNotFoundError:
            pass


def make_engine(url: str) -> Engine:
    database = sqlite_path(url)
    if database is not None:
        make_private(database)
        return _sqlite_engine(url)
    if make_url(url).get_backend_name() == "sqlite":
        return _sqlite_engine(url)
    engine = create_engine(url, pool_size=5, max_overflow=25)
    _ping_after_idle(engine)
    return engine


IDLE_PING_SECONDS = 5.0
"""A pooled connection unused this long is pinged before it is handed out: the database may have
closed it meanwhile (a restart, an idle timeout). One in constant use is not: a ping per transaction
is a round trip per transaction. If the database drops one of those, the transaction using it fails,
and the pool replaces every connection it held before the failure."""


def _ping_after_idle(engine: Engine) -> None:
    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _lent(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("idle_since")
        if since is None or time.monotonic() - since < IDLE_PING_SECONDS:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as e:
            # The pool closes this connection and lends another (a new one, if none is idle).
            raise DisconnectionError(f"an idle database connection was closed: {e}") from e


class Store:
    """Sessions over one database; `write()` transactions serialize where the rules need it.

    :param token_key: the key API tokens are hashed under (`server.tokens`); without one, a random key
        that lives as long as this object (tests, tools that never meet a token twice).
    """

    def __init__(self, url: str, token_key: bytes | None = None):
        self.url = url
        self.token_key = token_key or secrets.token_bytes(32)
        self.engine = make_engine(url)
        self.dialect = self.engine.dialect.name
        self._read = sessionmaker(self.engine, expire_on_commit=False)
        self._write = sessionmaker(self.engine.execution_options(hai_write=True), expire_on_commit=False)
        self.origin = new_origin()
        """Names this store's announcements on the PostgreSQL channel (`channel.py`)."""
        self.announcer = None if self.is_sqlite else Announcer(self.engine, self.origin)
        committed = None if self.announcer is None else self.announcer.announce
        for factory in (self._read, self._write):
            changes.track(factory, postgres=not self.is_sqlite, committed=committed)
        # SQLite has one writer at a time. Writers of this process queue on a lock that wakes the next
        # one as soon as the last commits, instead of polling the database lock (its busy handler
        # sleeps up to 100 ms between tries); other processes still meet the busy timeout.
        self._one_writer: threading.Lock | contextlib.nullcontext[None] = (
            threading.Lock() if self.is_sqlite else contextlib.nullcontext()
        )

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    def migrate(self) -> None:
        """Bring the schema to the newest revision; safe when several servers start at once."""
        cfg = AlembicConfig()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.execution_options(hai_write=True).begin() as conn:
            if not self.is_sqlite:
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
            cfg.attributes["connection"] = conn
            cfg.attributes["token_key"] = self.token_key
            command.upgrade(cfg, "head")
        if self.is_sqlite:
            # Old pages (e.g. tokens before they were hashed) must not linger in the write-ahead log.
            with self.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._read() as session, session.begin():
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A transaction that commits on success and rolls back on any error."""
        with self._one_writer, self._write() as session, session.begin():
            yield session

    def lock_setup(self, session: Session) -> None:
        """Serialize start-up writes of servers starting together on one database."""
        if not self.is_sqlite:
            session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})

    def job_ids(self, session: Session, count: int) -> list[int]:
        """`count` new job ids, ascending, for rows the write transaction `session` inserts itself.

        Known before the insert, they tell which row of a many-row INSERT is whose. SQLite gives a new
        row the highest id plus one, and this transaction holds the write lock until it commits.
        """
        if self.is_sqlite:
            top = session.execute(text("SELECT coalesce(max(id), 0) FROM jobs")).scalar_one()
            return list(range(top + 1, top + 1 + count))
        return sorted(session.scalars(_NEXT_JOB_IDS, {"n": count}))

    def lock_group(self, session: Session, group: str) -> None:
        """Serialize quota decisions of one group (SQLite already holds the write lock)."""
        if not self.is_sqlite:
            session.execute(text("SELECT name FROM groups WHERE name = :g FOR UPDATE"), {"g": group})

    def upkeep_advice(self) -> str | None:
        """What to change in the database server's upkeep before the store grows large, or None.

        PostgreSQL with autovacuum off keeps no table statistics, so its query planner guesses: the
        controller's UPDATE of 16 new jobs' reasons went through the state index and read all 10,000
        waiting jobs (2.1 ms in the database, against 0.2 ms by primary key once analyzed).
        """
        if self.is_sqlite:
            return None
        with self.engine.connect() as conn:
            if conn.exec_driver_sql("SHOW autovacuum").scalar() != "off":
                return None
        return (
            "PostgreSQL's autovacuum is off on this database server: its tables get no statistics "
            "(so queries plan badly as the queue grows) and dead rows are never reclaimed; turn it on "
            "(autovacuum = on in postgresql.conf) or run VACUUM ANALYZE regularly"
        )

    def listener(self, on_change: Callable[[], None]) -> Listener | None:
        """Calls `on_change` when another process commits changes to this database (not started);
        None on SQLite, which has no channel."""
        if self.announcer is None:
            return None
        return Listener(self.url, self.origin, on_change, self.announcer.heard_other)

    def dispose(self) -> None:
        if self.announcer is not None:
            self.announcer.close()
        self.engine.dispose()
