"""Acting for another user over HTTP: only a service identity may, only for the users its acts_for
covers, and then with exactly that user's rights; a config whose acts_for names nobody never starts."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hai_airflow.client import AsyncHaiClient, HaiClient, HaiError
from hai_airflow.spec import ON_BEHALF_OF, CpuJobSpec
from tests.server.test_acting import SERVICE, SERVICE_TOKEN
from tests.support import postgres
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer, free_port


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One server per store for the module: these tests only read, or submit jobs of their own."""
    env: dict[str, str] = {}
    if request.param == "postgresql":
        url: str = request.getfixturevalue("pg_database")
        postgres.reset_database(url)
        env["HAI_DATABASE_URL"] = url
    with LiveServer(tmp_path_factory.mktemp("hai"), TEST_CONFIG + SERVICE, env).start() as live:
        yield live


def airflow_for(server: LiveServer, user: str | None) -> HaiClient:
    return HaiClient(server=server.url, token=SERVICE_TOKEN, on_behalf_of=user)


def refusal(client: HaiClient) -> HaiError:
    with client, pytest.raises(HaiError) as e:
        client.jobs()
    return e.value


def test_a_service_gets_exactly_the_rights_of_the_user_it_acts_for(
    server: LiveServer, tmp_path: Path
) -> None:
    spec = CpuJobSpec(task_name="nightly", code_path=str(tmp_path), cmd="true")
    with airflow_for(server, "alice") as for_alice:
        job = for_alice.submit(spec)
        assert (job.user, job.submitted_via) == ("alice", "airflow")
        assert for_alice.whoami()["via"] == "airflow"
    with server.client(TOKENS["alice"]) as alice, server.client(TOKENS["bob"]) as bob:
        assert job.id in [j.id for j in alice.jobs()]
        assert job.id not in [j.id for j in bob.jobs(all=True)]
        bobs = bob.submit(spec)
    with airflow_for(server, "alice") as for_alice, pytest.raises(HaiError) as e:
        for_alice.job(bobs.id)
    assert e.value.status == 404

    async def whoami() -> dict[str, object]:
        async with AsyncHaiClient(server=server.url, token=SERVICE_TOKEN, on_behalf_of="carol") as c:
            return await c.whoami()

    assert asyncio.run(whoami())["user"] == "carol"


@pytest.mark.parametrize(
    ("token", "user", "status"),
    [
        pytest.param("admin-token", "alice", 403, id="a platform admin is no service"),
        pytest.param("alice-token", "alice", 403, id="a user naming herself"),
        pytest.param(SERVICE_TOKEN, "dave", 403, id="a user outside acts_for"),
        pytest.param(SERVICE_TOKEN, "root", 403, id="no such user"),
        pytest.param(SERVICE_TOKEN, "", 400, id="empty"),
    ],
)
def test_the_header_is_refused_naming_itself(server: LiveServer, token: str, user: str, status: int) -> None:
    e = refusal(HaiClient(server=server.url, token=token, on_behalf_of=user))
    assert (e.status, e.field) == (status, ON_BEHALF_OF)
    assert e.fix


def test_an_acts_for_naming_nobody_stops_the_server_naming_the_field(tmp_path: Path) -> None:
    home = tmp_path / "hai"
    home.mkdir()
    (home / "config.toml").write_text(TEST_CONFIG + SERVICE.replace("group:vision", "group:everyone"))
    args = [sys.executable, "-m", "hai_airflow.server", "--config", str(home / "config.toml")]
    out = subprocess.run(
        [*args, "--port", str(free_port())],
        env={**os.environ, "HAI_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "users[5].acts_for" in out.stderr and "group 'everyone' is not defined" in out.stderr
    assert not (home / "hai.db").exists()
