"""Security tier fixtures: the store a live server uses, SQLite or PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import postgres


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """One PostgreSQL database for the session (dropped at the end); skipped when unreachable."""
    reason = postgres.unavailable_reason()
    if reason is not None:
        print(f"\nSKIP PostgreSQL tests: {reason}")
        pytest.skip(reason)
    with postgres.temporary_database("hai_security_test") as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """Environment of a live server: its own SQLite under HAI_HOME, or the session's PostgreSQL emptied."""
    if request.param == "sqlite":
        return {}
    url: str = request.getfixturevalue("pg_database")
    postgres.reset_database(url)
    return {"HAI_DATABASE_URL": url}
