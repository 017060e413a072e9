"""Security tier fixtures: the store a live server uses, SQLite or PostgreSQL."""

from __future__ import annotations

import pytest

from tests.support import postgres


@pytest.fixture(params=["sqlite", "postgresql"])
def store_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """Environment of a live server: its own SQLite under HAI_HOME, or the session's PostgreSQL emptied."""
    if request.param == "sqlite":
        return {}
    url: str = request.getfixturevalue("pg_database")
    postgres.reset_database(url)
    return {"HAI_DATABASE_URL": url}
