"""Fixtures shared by every test folder: a live `hai serve` with a small config."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.live_server import TEST_CONFIG, LiveServer, start_server


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[LiveServer]:
    """A real server subprocess (SQLite, local backend) with `TEST_CONFIG`: 1 node of 8 virtual V100s;
    users admin/alice/bob/carol/dave with tokens `<name>-token` (see tests/support/live_server.py)."""
    with start_server(tmp_path / "hai", TEST_CONFIG) as server:
        yield server
