"""Security tier fixtures: the store a live server uses, SQLite or PostgreSQL."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import postgres
from tests.support.gitrepo import silent_url

STORES = ["sqlite", "postgresql"]


def _store_env(request: pytest.FixtureRequest) -> dict[str, str]:
    if request.param == "sqlite":
        return {}
    url: str = request.getfixturevalue("pg_database")
    postgres.reset_database(url)
    return {"HAI_DATABASE_URL": url}


@pytest.fixture(params=STORES)
def store_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """Environment of a live server: its own SQLite under HAI_HOME, or the session's PostgreSQL emptied."""
    return _store_env(request)


@pytest.fixture(scope="module", params=STORES)
def module_store_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """`store_env` for one server a whole module shares; none of its tests may take `store_env` too,
    which would empty the PostgreSQL database under that server."""
    return _store_env(request)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory another OS account (the job's, with run_as) may traverse: pytest's tmp_path is
    private to root. Skips unless the test runs as root, which starting jobs as another user needs."""
    if os.geteuid() != 0:
        pytest.skip("run_as needs the test to run as root (it starts jobs as another OS user)")
    path = Path(tempfile.mkdtemp(prefix="hai-sec-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def silent_host() -> Iterator[str]:
    """An http:// URL on the loopback whose server accepts and never answers: a clone that hangs."""
    with silent_url() as url:
        yield url
