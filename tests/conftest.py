"""Fixtures shared by every test folder: a live `hai serve` with a small config, a PostgreSQL database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import postgres
from tests.support.docker_engine import busybox_image, docker_engine, own_engine, torch_image
from tests.support.kube_apiserver import kube_apiserver
from tests.support.kube_node import kube_node
from tests.support.live_server import TEST_CONFIG, LiveServer, start_server

# The docker and kube tiers' fixtures, defined here once: a session fixture a test module imports is
# that module's own, so every module would start its own dockerd and cluster, all alive until the end
# (and kubelets sharing /var/log/pods remove each other's pod logs).
__all__ = ["busybox_image", "docker_engine", "kube_apiserver", "kube_node", "own_engine", "torch_image"]


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
