"""The clients' methods are the endpoints of `hai_airflow.endpoints`: one parameter list, default and
docstring each, whichever client calls it."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import httpx
import pytest

from hai_airflow import endpoints
from hai_airflow.client import AsyncHaiClient, HaiClient


def _endpoint_methods(cls: type) -> list[str]:
    return [name for name in vars(cls) if not name.startswith("_") and hasattr(endpoints, name)]


@pytest.mark.parametrize("cls", [HaiClient, AsyncHaiClient])
def test_a_method_takes_its_endpoints_parameters_and_documentation(cls: type) -> None:
    names = _endpoint_methods(cls)
    assert {"health", "jobs", "usage", "wait"} <= set(names)
    for name in names:
        build, method = getattr(endpoints, name), getattr(cls, name)
        parameters = list(inspect.signature(method).parameters.values())
        assert parameters[0].name == "self", name
        assert parameters[1:] == list(inspect.signature(build).parameters.values()), name
        assert method.__doc__ == build.__doc__, name
        assert method.__qualname__ == f"{cls.__name__}.{name}"


def test_the_async_client_sends_what_the_endpoint_builds() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=[])

    async def ask() -> Any:
        transport = httpx.MockTransport(answer)
        async with AsyncHaiClient(server="http://hai.test", token="t", transport=transport) as client:
            return await client.jobs(user="alice", array=3), await client.usage()

    assert asyncio.run(ask()) == ([], [])
    jobs, usage = seen
    assert (jobs.url.path, dict(jobs.url.params)) == (
        "/api/v1/jobs",
        {"all": "false", "user": "alice", "array": "3"},
    )
    assert (usage.url.path, dict(usage.url.params)) == ("/api/v1/usage", {"by": "user"})
