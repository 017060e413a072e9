"""Input limits against a live server: oversized bodies, commands and env, NUL bytes, integers out of
range and malformed bodies are refused with the JSON error shape, and nothing is stored."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hai_airflow.spec import MAX_CMD_BYTES, MAX_ENV_BYTES, STORE_INT_MAX
from tests.support import postgres
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer, start_server

ADMIN = {"Authorization": f"Bearer {TOKENS['admin']}"}
ALICE = {"Authorization": f"Bearer {TOKENS['alice']}"}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One live server per store for the whole module (no test here starts a job)."""
    env: dict[str, str] = {}
    if request.param == "postgresql":
        url: str = request.getfixturevalue("pg_database")
        postgres.reset_database(url)
        env = {"HAI_DATABASE_URL": url}
    home = tmp_path_factory.mktemp(f"limits-{request.param}")
    with start_server(home / "hai", TEST_CONFIG, env) as live:
        yield live


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("code")
    return path


def spec(code: Path, **fields: Any) -> dict[str, Any]:
    return {"mode": "cpu", "task_name": "limits", "code_path": str(code), "cmd": "true", **fields}


def job_count(server: LiveServer) -> int:
    r = httpx.get(f"{server.url}/api/v1/jobs", params={"all": True, "limit": 100_000}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return len(r.json())


def refused(r: httpx.Response, status: int, field: str | None) -> dict[str, Any]:
    """The response is the JSON refusal: status, the field named, and both sentences present."""
    assert r.status_code == status, r.text[:2000]
    assert r.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = r.json()
    assert set(body) == {"error", "field", "fix"}, body
    assert body["field"] == field, body
    assert body["error"] and body["fix"], body
    assert "None" not in body["error"] and "Correct [" not in body["fix"], body
    return body


def submit(server: LiveServer, body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/api/v1/jobs", json=body, headers=ALICE, timeout=60, **kw)


# ---- sizes --------------------------------------------------------------------------------------


def test_a_50_mb_env_value_is_refused_before_it_is_read_and_nothing_is_stored(
    server: LiveServer, code: Path
) -> None:
    before = job_count(server)
    body = {"spec": spec(code, env={"BIG": "x" * (50 << 20)})}
    err = refused(submit(server, body), 413, None)
    assert "larger than 1,048,576 bytes" in err["error"]
    assert job_count(server) == before


def test_a_streamed_body_without_length_is_cut_off_at_the_limit(server: LiveServer, code: Path) -> None:
    before = job_count(server)
    payload = json.dumps({"spec": spec(code, env={"BIG": "x" * (4 << 20)})}).encode()

    def chunks() -> Iterator[bytes]:
        step = 64 << 10
        for i in range(0, len(payload), step):
            yield payload[i : i + step]

    r = httpx.post(
        f"{server.url}/api/v1/jobs",
        content=chunks(),
        headers={**ALICE, "Content-Type": "application/json"},
        timeout=60,
    )
    assert "content-length" not in {k.lower() for k in r.request.headers}
    refused(r, 413, None)
    assert job_count(server) == before


def test_env_over_its_total_size_is_refused_naming_env(server: LiveServer, code: Path) -> None:
    before = job_count(server)
    values = {f"V{i}": "x" * 1000 for i in range(MAX_ENV_BYTES // 1000 + 1)}
    err = refused(submit(server, {"spec": spec(code, env=values)}), 422, "spec.env")
    assert "bytes" in err["error"] and "file" in err["fix"]
    assert job_count(server) == before


@pytest.mark.parametrize(
    "cmd",
    [
        pytest.param("x" * (MAX_CMD_BYTES + 1), id="one byte over MAX_ARG_STRLEN with its NUL"),
        pytest.param("é" * (MAX_CMD_BYTES // 2 + 1), id="multi-byte characters counted as UTF-8"),
    ],
)
def test_cmd_over_the_kernels_argument_limit_is_refused(server: LiveServer, code: Path, cmd: str) -> None:
    before = job_count(server)
    err = refused(submit(server, {"spec": spec(code, cmd=cmd)}), 422, "spec.cmd")
    assert "at most 131,071 bytes" in err["error"] and "script" in err["fix"]
    assert job_count(server) == before


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        pytest.param({"task_name": "a\x00b"}, "spec.task_name", id="task name"),
        pytest.param({"cmd": "echo hi\x00rm -rf /"}, "spec.cmd", id="command"),
        pytest.param({"env": {"A": "1\x002"}}, "spec.env.A", id="env value"),
        pytest.param({"env": {"A\x00B": "1"}}, "spec.env.A\x00B", id="env name"),
        pytest.param({"model_dir": "/tmp/x\x00y"}, "spec.model_dir", id="model dir"),
        pytest.param({"image": "busybox\x00"}, "spec.image", id="image"),
    ],
)
def test_nul_bytes_are_refused_naming_the_field(
    server: LiveServer, code: Path, fields: dict[str, Any], field: str
) -> None:
    before = job_count(server)
    err = refused(submit(server, {"spec": spec(code, **fields)}), 422, field)
    assert "NUL" in err["error"] or "env names" in err["error"]
    assert job_count(server) == before


def test_a_nul_in_the_client_key_is_refused(server: LiveServer, code: Path) -> None:
    before = job_count(server)
    refused(submit(server, {"spec": spec(code), "client_key": "k\x00"}), 422, "client_key")
    assert job_count(server) == before


# ---- integers -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "field"),
    [
        pytest.param("POST", "/jobs/-44387061654387253248/cancel", "job_id", id="cancel, far below"),
        pytest.param("GET", "/jobs/99999999999999999999", "job_id", id="job, 2^66"),
        pytest.param("GET", f"/jobs/{2**63}", "job_id", id="job, 2^63"),
        pytest.param("GET", f"/jobs/{STORE_INT_MAX + 1}", "job_id", id="job, past PostgreSQL INTEGER"),
        pytest.param("GET", "/jobs/0", "job_id", id="job 0"),
        pytest.param("GET", f"/instances/{2**64}", "instance_id", id="instance"),
        pytest.param("GET", f"/instances/{2**64}/log", "instance_id", id="instance log"),
        pytest.param("GET", "/jobs/1/wait?timeout=1e400", "timeout", id="infinite timeout"),
        pytest.param("GET", f"/instances/1/log?tail={2**64}", "tail", id="huge tail"),
        pytest.param("GET", f"/jobs?limit={2**64}", "limit", id="huge list limit"),
        pytest.param("GET", f"/quota/check?gpus={2**64}", "gpus", id="huge gpu count"),
    ],
)
def test_integers_out_of_range_are_422_never_500(
    server: LiveServer, method: str, path: str, field: str
) -> None:
    r = httpx.request(method, f"{server.url}/api/v1{path}", headers=ADMIN, timeout=30)
    refused(r, 422, field)


def test_an_id_in_range_that_does_not_exist_is_404(server: LiveServer) -> None:
    r = httpx.get(f"{server.url}/api/v1/jobs/{STORE_INT_MAX}", headers=ADMIN)
    refused(r, 404, None)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        pytest.param({"model_id": 2**63}, "spec.model_id", id="model id 2^63"),
        pytest.param({"project_id": -(2**70)}, "spec.project_id", id="project id far below"),
        pytest.param({"project_storage": [2**64]}, "spec.project_storage[0]", id="storage id"),
        pytest.param({"shm": 2**63}, "spec.shm", id="shared memory"),
        pytest.param({"model_id": True}, "spec.model_id", id="true for a number"),
        pytest.param({"max_schedule": "4"}, "spec.max_schedule", id="text for a number"),
    ],
)
def test_body_integers_out_of_range_or_of_the_wrong_type_are_422(
    server: LiveServer, code: Path, fields: dict[str, Any], field: str
) -> None:
    before = job_count(server)
    refused(submit(server, {"spec": spec(code, **fields)}), 422, field)
    assert job_count(server) == before


def test_promote_states_its_choices(server: LiveServer) -> None:
    r = httpx.post(f"{server.url}/api/v1/jobs/1/promote", json={"max_schedule": 5}, headers=ADMIN)
    err = refused(r, 422, "max_schedule")
    assert "4, 6, 8, 24, 48" in err["error"]


# ---- malformed bodies ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "content_type", "in_error"),
    [
        pytest.param(b"", "application/json", "empty or null", id="empty"),
        pytest.param(b"null", "application/json", "empty or null", id="null"),
        pytest.param(b"[]", "application/json", "not an array", id="empty array"),
        pytest.param(b"[10]", "application/json", "not an array", id="[10]"),
        pytest.param(b"10", "application/json", "not a number", id="a number"),
        pytest.param(b'"spec"', "application/json", "not a string", id="a string"),
        pytest.param(b'{"spec": ', "application/json", "not valid JSON", id="cut short"),
        pytest.param(b"spec=1", "application/json", "not valid JSON", id="not JSON"),
        pytest.param(b'{"spec": {}}', "text/plain", "must be JSON, not text/plain", id="wrong content type"),
    ],
)
def test_a_malformed_submit_body_reads_as_a_sentence(
    server: LiveServer, content: bytes, content_type: str, in_error: str
) -> None:
    before = job_count(server)
    r = httpx.post(
        f"{server.url}/api/v1/jobs", content=content, headers={**ALICE, "Content-Type": content_type}
    )
    err = refused(r, 422, None)
    assert in_error in err["error"]
    assert "request body" in err["error"]
    if "JSON," not in err["error"] and "valid JSON" not in err["error"]:
        assert "a JSON object with `spec`" in err["error"]
    assert '{"spec": ...}' in err["fix"] and "application/json" in err["fix"]
    assert job_count(server) == before


def test_a_malformed_promote_body_names_its_own_field(server: LiveServer) -> None:
    r = httpx.post(f"{server.url}/api/v1/jobs/1/promote", content=b"[10]", headers=ADMIN)
    err = refused(r, 422, None)
    assert "`max_schedule`" in err["error"] and '{"max_schedule": ...}' in err["fix"]


# ---- the dashboard ------------------------------------------------------------------------------


@pytest.mark.parametrize("ident", ["²", "٣", "1" * 5000, "-1", "abc"])
def test_the_dashboards_job_lookup_answers_a_bad_id_with_an_html_page(server: LiveServer, ident: str) -> None:
    r = httpx.get(f"{server.url}/ui/jobs", params={"id": ident}, follow_redirects=False)
    assert 400 <= r.status_code < 500, r.text[:500]
    assert r.headers["content-type"].startswith("text/html")
    assert "not a job id" in r.text


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        pytest.param('"task_name": "\\ud800"', "spec.task_name", id="in a checked text field"),
        pytest.param('"task_name": "t", "gpu_type": "\\ud800"', None, id="anywhere else"),
    ],
)
def test_a_lone_surrogate_escape_is_refused_not_stored(
    server: LiveServer, code: Path, fields: str, field: str | None
) -> None:
    # json.loads turns "\ud800" into text that no store, file or process can encode.
    before = job_count(server)
    spec = f'"mode": "standalone", "resource_pkg": 454, "code_path": "{code}", "cmd": "true", {fields}'
    r = httpx.post(
        f"{server.url}/api/v1/jobs",
        content=('{"spec": {' + spec + "}}").encode(),
        headers={**ALICE, "Content-Type": "application/json"},
    )
    err = refused(r, 422, field)
    assert "UTF-8" in err["fix"]
    assert job_count(server) == before
