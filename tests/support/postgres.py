"""A throwaway PostgreSQL database on the machine's server (127.0.0.1:5432, trust auth)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

PG_HOST = os.environ.get("HAI_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("HAI_TEST_PG_PORT", "5432"))
PG_USER = os.environ.get("HAI_TEST_PG_USER", "postgres")
PG_ADMIN_DB = os.environ.get("HAI_TEST_PG_DB", "test")


def _connect(dbname: str):  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(
        host=PG_HOST, port=PG_PORT, user=PG_USER, dbname=dbname, autocommit=True, connect_timeout=3
    )


def unavailable_reason() -> str | None:
    """Why PostgreSQL cannot be used here, or None when it can."""
    try:
        import psycopg  # noqa: F401
    except ImportError as e:
        return f"psycopg is not installed ({e})"
    try:
        with _connect(PG_ADMIN_DB) as conn:
            conn.execute("SELECT 1")
    except Exception as e:
        return f"PostgreSQL at {PG_HOST}:{PG_PORT} (user {PG_USER}, db {PG_ADMIN_DB}) is unreachable: {e}"
    return None


def url_of(dbname: str) -> str:
    return f"postgresql+psycopg://{PG_USER}@{PG_HOST}:{PG_PORT}/{dbname}"


@contextmanager
def temporary_database(prefix: str = "hai_test") -> Iterator[str]:
    """Create a uniquely named database, yield its SQLAlchemy URL, drop it afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with _connect(PG_ADMIN_DB) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url_of(name)
    finally:
        with _connect(PG_ADMIN_DB) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def reset_database(url: str) -> None:
    """Empty a database made by `temporary_database` (all tables gone) for the next test."""
    name = url.rsplit("/", 1)[1]
    with _connect(name) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
