"""Fixtures shared by every test folder: a live `hai serve` with a small config, a PostgreSQL database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import durations, postgres
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


# Tests that start or use the one Docker engine and Kubernetes cluster of the session: under
# pytest-xdist they all run in one worker, one after another (`make test` runs --dist loadgroup).
ENGINE_FIXTURES = frozenset({"docker_engine", "kube_apiserver", "kube_node", "own_engine"})
ENGINE_MARKERS = ("docker", "kube")
ENGINE_GROUP = pytest.mark.xdist_group("engine").mark


def xdist_group_of(item: pytest.Item) -> str | None:
    """The group whose tests must run in one worker: "engine" for the engine and cluster tiers,
    a module (or package) for tests that share a module-, class- or package-scoped fixture."""
    if ENGINE_FIXTURES.intersection(item.fixturenames) or any(
        item.get_closest_marker(name) for name in ENGINE_MARKERS
    ):
        return "engine"
    shared = {
        definitions[-1].scope
        for definitions in item._fixtureinfo.name2fixturedefs.values()  # type: ignore[attr-defined]
        if definitions
    }
    if "package" in shared:
        return str(Path(item.nodeid.split("::", 1)[0]).parent)
    if shared & {"module", "class"}:
        return item.nodeid.split("::", 1)[0]
    return None


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark the test's xdist group (read by --dist loadgroup) as soon as it is made: xdist renames the
    grouped tests in its own collection hook, which may run before this project's."""
    group = xdist_group_of(item)
    if group is not None:
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The engine group first: it is the longest chain, so it starts at once while the other workers
    share the rest. Runs after xdist's own hook, so it can check that xdist took the groups."""
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") != ENGINE_GROUP)
    if hasattr(config, "workerinput") and config.getvalue("loadgroup"):
        ungrouped = [i.nodeid for i in items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
        if ungrouped:
            raise pytest.UsageError(
                f"pytest-xdist did not put {ungrouped[0]} in its group, so tests that share an engine or a "
                f"server would run in several workers at once; install the pytest that pyproject.toml names"
            )


def pytest_configure(config: pytest.Config) -> None:
    recorder = durations.plugin(config)
    if recorder is not None:
        config.pluginmanager.register(recorder, "hai-durations")


def pytest_unconfigure(config: pytest.Config) -> None:
    postgres.stop()  # the worker's own PostgreSQL server, where one was started
