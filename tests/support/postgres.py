"""A throwaway PostgreSQL database: on the machine's server (127.0.0.1:5432, trust auth) in a run of one
process; on a server of the worker's own under pytest-xdist.

Why a server a worker: the change feed holds back a change while an older transaction of the server
runs, and a snapshot's horizon spans every database of the server, so another worker's transactions
would hold this worker's feed back and its tests would see changes late.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support import own_postgres


@dataclass
class Server:
    host: str
    port: int
    user: str
    admin_db: str
    own: own_postgres.OwnPostgres | None = None


MACHINE = Server(
    os.environ.get("HAI_TEST_PG_HOST", "127.0.0.1"),
    int(os.environ.get("HAI_TEST_PG_PORT", "5432")),
    os.environ.get("HAI_TEST_PG_USER", "postgres"),
    os.environ.get("HAI_TEST_PG_DB", "test"),
)
_server: Server | None = None


def server() -> Server:
    """The server this process's databases are made on: under xdist the worker's own, started on first
    use (the machine's where no PostgreSQL binaries are installed)."""
    global _server
    if _server is None:
        _server = MACHINE
        if os.environ.get("PYTEST_XDIST_WORKER") and own_postgres.unavailable_reason() is None:
            own = own_postgres.OwnPostgres(Path(tempfile.mkdtemp(prefix="hai-worker-pg-", dir="/tmp")))
            own.start()
            _server = Server("127.0.0.1", own.port, "postgres", "postgres", own)
    return _server


def stop() -> None:
    """Stop and remove the worker's own server, if one was started."""
    global _server
    if _server is not None and _server.own is not None:
        _server.own.close()
    _server = None


def _connect(dbname: str):  # type: ignore[no-untyped-def]
    import psycopg

    at = server()
    return psycopg.connect(
        host=at.host, port=at.port, user=at.user, dbname=dbname, autocommit=True, connect_timeout=3
    )


def unavailable_reason() -> str | None:
    """Why PostgreSQL cannot be used here, or None when it can."""
    try:
        import psycopg  # noqa: F401
    except ImportError as e:
        return f"psycopg is not installed ({e})"
    try:
        with _connect(server().admin_db) as conn:
            conn.execute("SELECT 1")
    except Exception as e:
        at = server()
        return f"PostgreSQL at {at.host}:{at.port} (user {at.user}, db {at.admin_db}) is unreachable: {e}"
    return None


def url_of(dbname: str) -> str:
    at = server()
    return f"postgresql+psycopg://{at.user}@{at.host}:{at.port}/{dbname}"


@contextmanager
def temporary_database(prefix: str = "hai_test") -> Iterator[str]:
    """Create a uniquely named database, yield its SQLAlchemy URL, drop it afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with _connect(server().admin_db) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url_of(name)
    finally:
        with _connect(server().admin_db) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def reset_database(url: str) -> None:
    """Empty a database made by `temporary_database` (all tables gone) for the next test."""
    name = url.rsplit("/", 1)[1]
    with _connect(name) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
