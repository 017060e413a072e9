"""A submit naming a spec field that does not exist: the server's 422 names the field and, for a near
miss or a job-file key, the field it meant, as a script sending JSON or `hai` relaying it sees."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from hai_airflow import api_routes
from tests.support.live_cli import module_server  # noqa: F401 (the fixture `server`)
from tests.support.live_server import LiveServer

SPEC = {"mode": "standalone", "task_name": "x", "code_path": "/tmp", "cmd": "true", "resource_pkg": 454}


def refusal(server: LiveServer, **extra: Any) -> dict[str, Any]:
    answer = httpx.post(server.url + api_routes.submit({}).path, json={"spec": {**SPEC, **extra}},
                        headers={"Authorization": "Bearer alice-token"})  # fmt: skip
    assert answer.status_code == 422, answer.text
    body: dict[str, Any] = answer.json()
    return body


@pytest.mark.parametrize(
    ("sent", "meant"),
    [
        pytest.param("gpu_typ", "gpu_type", id="a typo"),
        pytest.param("imag", "image", id="a letter short"),
        pytest.param("time_limit", "time_limit_seconds", id="a job-file key for its field"),
        pytest.param("grace", "grace_seconds", id="another job-file key"),
    ],
)
def test_an_unknown_spec_field_says_which_was_meant(server: LiveServer, sent: str, meant: str) -> None:
    body = refusal(server, **{sent: "V100"})
    assert body["field"] == f"spec.{sent}"
    assert body["error"] == f"spec.{sent} is not a known field"
    assert body["fix"] == f"Did you mean spec.{meant}? Rename spec.{sent} to spec.{meant}"


def test_a_field_near_none_is_told_to_go(server: LiveServer) -> None:
    body = refusal(server, colour="red")
    assert body["field"] == "spec.colour"
    assert "Did you mean" not in body["fix"] and "Remove it" in body["fix"]
