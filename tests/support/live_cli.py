"""A live `hai serve` of a test module's own and the `hai` CLI run against it as a user, for tests of
what a user does with the real CLI (`hai_ok`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.security.cli import hai
from tests.support.live_server import TEST_CONFIG, LiveServer, start_server


@pytest.fixture(scope="module", name="server")
def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A live server (TEST_CONFIG) of the test module's own; import it into the module to use it."""
    with start_server(tmp_path_factory.mktemp("hai"), TEST_CONFIG) as live:
        yield live


def hai_ok(server: LiveServer, *args: str, user: str = "alice") -> str:
    """`hai *args` as `user`: its stdout; fails the test when it exits non-zero."""
    done = hai(server, user, *args)
    assert done.returncode == 0, f"hai {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout
