"""HaiHook / HaiAsyncHook: the `hai` connection, the fallback to the client's own lookup, the log tail."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest
from airflow.sdk import Connection
from airflow.sdk.exceptions import AirflowNotFoundException

from hai_airflow.client import HaiClient
from hai_airflow.hooks.hai import HaiAsyncHook, HaiHook, client_arguments
from hai_airflow.spec import CpuJobSpec
from tests.airflow.helpers import wait_for
from tests.support.live_server import LiveServer


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param(
            {"host": "http://hai.example:8765", "password": "t0ken"},
            {"server": "http://hai.example:8765", "token": "t0ken", "region": None},
            id="host is a URL",
        ),
        pytest.param(
            {"host": "hai.example", "port": 443, "schema": "https", "extra": json.dumps({"region": "gz"})},
            {"server": "https://hai.example:443", "token": None, "region": "gz"},
            id="bare host, port, scheme and region",
        ),
        pytest.param(
            {"host": "http://hai.example", "port": 9000},
            {"server": "http://hai.example:9000", "token": None, "region": None},
            id="URL without port plus port field",
        ),
        pytest.param(
            {"extra": json.dumps({"region": "gz"})},
            {"server": None, "token": None, "region": "gz"},
            id="region only: the client looks the server up",
        ),
    ],
)
def test_client_arguments_from_a_connection(fields: dict[str, object], expected: dict[str, object]) -> None:
    conn = Connection(conn_id="hai_x", conn_type="hai", **fields)  # type: ignore[arg-type]
    assert client_arguments(conn) == expected


def test_hook_talks_to_the_server_of_the_connection(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn("alice-token")
    hook = HaiHook()
    ok, message = hook.test_connection()
    assert ok, message
    assert "alice" in message and server.url in message
    hook.close()


def test_default_connection_falls_back_to_hai_environment(
    hai_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_HAI_DEFAULT", raising=False)
    monkeypatch.setenv("HAI_SERVER", hai_server.url)
    monkeypatch.setenv("HAI_TOKEN", "bob-token")
    assert HaiHook().get_conn().whoami()["user"] == "bob"
    with pytest.raises(AirflowNotFoundException):
        HaiHook("hai_missing").get_conn()


def test_log_tail_sync_and_async_agree(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn()
    with server.client() as client:
        job = client.submit(
            CpuJobSpec(task_name="lines", code_path="/tmp", cmd="for i in 1 2 3 4 5; do echo line$i; done")
        )
        wait_for(client, job.id, lambda j: j.state == "SUCCEEDED")

    assert HaiHook().log_tail(job.id, 2) == ["line4", "line5"]

    async def tail() -> list[str]:
        hook = HaiAsyncHook()
        async with await hook.get_conn() as client:
            return await hook.log_tail(client, job.id, 3)

    assert asyncio.run(tail()) == ["line3", "line4", "line5"]


def test_log_tail_of_a_job_that_never_started_is_empty(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn()
    with server.client() as client:
        job = client.submit(CpuJobSpec(task_name="huge", code_path="/tmp", cmd="true", cpus=1000))
    assert HaiHook().log_tail(job.id, 5) == []
    assert isinstance(HaiHook().get_conn(), HaiClient)
