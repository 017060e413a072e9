"""Fixtures shared by every test folder: a live `hai serve` with a small config, a PostgreSQL database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import postgres
from tests.support.live_server import TEST_CONFIG, LiveServer, start_server


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[LiveServer]:
    """A real server subprocess (SQLite, local backend) with `TEST_CONFIG`: 1 node of 8 virtual V100s;
    users admin/alice/bob/carol/dave with tokens `<name>-token` (see tests/support/live_server.py)."""
    with start_server(tmp_path / "hai", TEST_CONFIG) as server:
        yield server


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """One PostgreSQL database for the session (dropped at the end); skipped when unreachable."""
    reason = postgres.unavailable_reason()
    if reason is not None:
        print(f"\nSKIP PostgreSQL tests: {reason}")
        pytest.skip(reason)
    with postgres.temporary_database("hai_test") as url:
        yield url
