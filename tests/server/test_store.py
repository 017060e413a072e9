"""The store's PostgreSQL pool: a connection the database closed while it sat idle is replaced before
anyone uses it, without a ping per transaction for connections in constant use."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from hai_airflow.server.store import database as store_module
from hai_airflow.server.store.database import Store
from tests.support import postgres


def _backend(store: Store) -> int:
    with store.engine.connect() as conn:
        pid: int = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    return pid


def _terminate(database_url: str, pid: int) -> None:
    name = database_url.rsplit("/", 1)[1]
    with psycopg.connect(postgres.url_of(name).replace("+psycopg", ""), autocommit=True) as admin:
        row = admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
    assert row == (True,)


def test_an_idle_connection_the_database_closed_is_replaced_before_use(
    pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(pg_database)
    try:
        first = _backend(store)
        _terminate(pg_database, first)
        monkeypatch.setattr(store_module, "IDLE_PING_SECONDS", 0.0)  # it has been idle long enough
        second = _backend(store)  # pinged, found closed, replaced: no error reaches the caller
        assert second != first
        # Used again at once, a connection is not pinged: a closure fails that one transaction...
        monkeypatch.setattr(store_module, "IDLE_PING_SECONDS", 3600.0)
        _terminate(pg_database, second)
        with pytest.raises(OperationalError):
            _backend(store)
        # ...and the pool replaced the connection, so the next one works.
        assert _backend(store) not in (first, second)
    finally:
        store.dispose()


def test_a_postgresql_server_without_autovacuum_is_named_at_start(db_url: str) -> None:
    """Without statistics the planner guesses and dead rows pile up: `hai serve` says so at start."""
    store = Store(db_url)
    try:
        advice = store.upkeep_advice()
        if store.is_sqlite:
            assert advice is None
            return
        with store.engine.connect() as conn:
            setting = conn.exec_driver_sql("SHOW autovacuum").scalar()
        if setting == "off":
            assert advice is not None and "autovacuum" in advice and "VACUUM ANALYZE" in advice
        else:
            assert advice is None
    finally:
        store.dispose()
