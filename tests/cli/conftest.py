"""CLI test helpers: an isolated HAI_HOME and one way to run `hai` as a user would."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from hai_airflow.cli.main import app
from tests.support.live_server import TEST_CONFIG, LiveServer, start_server

Hai = Callable[..., Result]


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test reads the developer's ~/.hai or their HAI_* variables."""
    home = tmp_path / "hai-home"
    home.mkdir()
    monkeypatch.setenv("HAI_HOME", str(home))
    for name in ("HAI_SERVER", "HAI_TOKEN", "HAI_REGION", "HAI_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture
def hai() -> Hai:
    """Run `hai ARGS...`; returns click's Result with separate stdout and stderr."""
    runner = CliRunner()

    def run(*args: str, env: dict[str, str] | None = None, input: str | None = None) -> Result:
        return runner.invoke(app, list(args), env=env, input=input, catch_exceptions=False)

    return run


def free_port() -> int:
    """A local port nothing listens on (the OS just handed it out and it was closed again)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def json_out(result: Result) -> Any:
    """The command's stdout as JSON; fails the test if it is not."""
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A live server (TEST_CONFIG) of the test module's own, started once for the module."""
    with start_server(tmp_path_factory.mktemp("hai"), TEST_CONFIG) as live:
        yield live


@pytest.fixture
def clean(server: LiveServer) -> Iterator[LiveServer]:
    """The module's server; each test starts with free GPUs and leaves none held."""
    yield server
    server.cancel_all()
