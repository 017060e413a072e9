"""The faults tier's parts: `hai` as a user runs it (the CLI tests' isolated home), and a PostgreSQL of
the test's own to stop, start and cut off."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import hai, isolated_home
from tests.support.own_postgres import OwnPostgres, unavailable_reason

__all__ = ["hai", "isolated_home"]


@pytest.fixture
def database() -> Iterator[OwnPostgres]:
    why = unavailable_reason()
    if why is not None:
        pytest.skip(f"faults tier: {why}")
    # Not pytest's tmp_path: the postgres account must reach it.
    pg = OwnPostgres(Path(tempfile.mkdtemp(prefix="hai-faults-pg-", dir="/tmp")))
    pg.start()
    try:
        yield pg
    finally:
        pg.close()
