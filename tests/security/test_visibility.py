"""Least visibility: a user sees others' jobs only as the queue needs; /metrics needs its token; the
dashboard never starves the API and renders behind a TLS proxy."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from hai_airflow.spec import OTHER_USERS_JOB, StandaloneJobSpec
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer

METRICS_TOKEN = "prometheus-scrape-token-0123456789"
CONFIG = TEST_CONFIG.replace(
    'backend = "local"\n', f'backend = "local"\nmetrics_token = "{METRICS_TOKEN}"\n', 1
)
CONTENT_FIELDS = (
    "task_name",
    "user",
    "group",
    "spec",
    "client_key",
    "latest_checkpoint",
    "placement",
    "reason",
)
"""JobView fields that tell what a job runs or whose it is: never in another user's queue entry."""


def bearer(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[user]}"}


@pytest.fixture
def server(tmp_path: Path, store_env: dict[str, str]) -> Iterator[LiveServer]:
    with LiveServer(tmp_path / "hai", CONFIG, store_env).start() as live:
        yield live


class Secrets:
    """Alice's waiting job, each of whose private strings is unique to this test."""

    def __init__(self, root: Path) -> None:
        tag = uuid.uuid4().hex[:10]
        self.env_value = f"env-secret-{tag}"
        self.cmd_word = f"cmd-secret-{tag}"
        self.task_name = f"task-secret-{tag}"
        self.client_key = f"key-secret-{tag}"
        self.code_path = root / f"code-secret-{tag}"
        self.code_path.mkdir()

    @property
    def all(self) -> tuple[str, ...]:
        return (self.env_value, self.cmd_word, self.task_name, self.client_key, self.code_path.name)


def submit_jobs(server: LiveServer, secrets: Secrets, code: Path) -> tuple[int, int, int]:
    """Alice holds every GPU, then her secret job and one of dave's (group nlp) wait."""
    plain = {"code_path": str(code), "cmd": "sleep 120", "resource_pkg": 457}
    with server.client(TOKENS["alice"]) as alice, server.client(TOKENS["dave"]) as dave:
        holder = alice.submit(StandaloneJobSpec(task_name="holds-all", **plain))
        waiting = alice.submit(
            StandaloneJobSpec(
                task_name=secrets.task_name,
                code_path=str(secrets.code_path),
                cmd=f"echo {secrets.cmd_word}; sleep 120",
                env={"DATA_TAG": secrets.env_value},  # a key that names no secret: not masked
                resource_pkg=457,
            ),
            client_key=secrets.client_key,
        )
        daves = dave.submit(StandaloneJobSpec(task_name="daves-task", **plain))
        deadline = time.monotonic() + 30
        while alice.job(holder.id).state != "RUNNING":
            assert time.monotonic() < deadline, "the holder did not start"
            time.sleep(0.1)
    return holder.id, waiting.id, daves.id


def entry_of(queue: list[dict[str, Any]], job_id: int) -> dict[str, Any]:
    return next(e for e in queue if e["job"]["id"] == job_id)


def assert_absent(raw: bytes | str, secrets: Secrets, where: str) -> None:
    text = raw.decode() if isinstance(raw, bytes) else raw
    leaked = [s for s in secrets.all if s in text]
    assert not leaked, f"{where} leaks {leaked}"


def _forecast_seen(http: httpx.Client, job_id: int, viewer: str) -> dict[str, Any]:
    """The job's forecast in the viewer's queue, once the server's forecaster has made one."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        forecast: dict[str, Any] | None = entry_of(
            http.get("/api/v1/queue", headers=bearer(viewer)).json(), job_id
        )["forecast"]
        if forecast is not None and forecast["start_at"] is not None:
            return forecast
        time.sleep(0.1)
    raise AssertionError(f"no forecast of job {job_id} in {viewer}'s queue")


def test_others_see_a_waiting_job_only_as_the_queue_needs(server: LiveServer, tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    secrets = Secrets(tmp_path)
    _, waiting, daves = submit_jobs(server, secrets, code)

    with httpx.Client(base_url=server.url, timeout=30) as http:
        # bob shares alice's group but administers nothing: her job is a GPU request without content.
        raw = http.get("/api/v1/queue", headers=bearer("bob"))
        assert raw.status_code == 200, raw.text
        assert_absent(raw.content, secrets, "bob's GET /queue")
        seen = entry_of(raw.json(), waiting)
        assert seen["job"] == {
            "visibility": "other",
            "id": waiting,
            "owner": OTHER_USERS_JOB,
            "mode": "standalone",
            "state": "PENDING",
            "priority": "low",
            "max_schedule": 0,
            "gpus": 8,
            "gpu_type": "V100",
            "workers": 1,
            "min_workers": None,
            "size": 1,
            "submitted_at": seen["job"]["submitted_at"],
        }
        assert seen["position"] >= 1 and seen["weight"] >= 0 and seen["reason"] and seen["terms"]
        assert not set(CONTENT_FIELDS) & set(seen["job"])
        forecast = _forecast_seen(http, waiting, "bob")
        assert {k for k, v in forecast.items() if v is not None} <= {"start_at", "horizon", "at"}
        assert forecast["start_at"] is not None and forecast["source"] is None

        for path in (
            "/api/v1/jobs?all=true",
            "/api/v1/jobs?all=true&state=PENDING",
            f"/api/v1/jobs?client_key={secrets.client_key}",
            "/api/v1/jobs?group=vision",
            "/api/v1/nodes",
            "/api/v1/quota",
            "/api/v1/quotas",
        ):
            r = http.get(path, headers=bearer("bob"))
            assert r.status_code == 200, (path, r.text)
            assert_absent(r.content, secrets, f"bob's GET {path}")
            if path.startswith("/api/v1/jobs"):
                assert r.json() == [], f"bob's GET {path} lists others' jobs"
        refused = http.get("/api/v1/jobs?user=alice", headers=bearer("bob"))
        assert refused.status_code == 403 and refused.json()["field"] == "user"
        assert http.get(f"/api/v1/jobs/{waiting}", headers=bearer("bob")).status_code == 404

        page = http.get("/ui/queue", headers=bearer("bob"))
        assert page.status_code == 200, page.text
        assert_absent(page.content, secrets, "bob's /ui/queue")
        assert OTHER_USERS_JOB in page.text.replace("&#39;", "'") and f'data-job="{waiting}"' in page.text

        # alice, her group's admin and the platform admin see it in full; carol not dave's (group nlp).
        for viewer in ("alice", "carol", "admin"):
            full = entry_of(http.get("/api/v1/queue", headers=bearer(viewer)).json(), waiting)["job"]
            assert full["visibility"] == "full" and full["user"] == "alice", viewer
            assert (
                full["spec"]["env"] == {"DATA_TAG": secrets.env_value}
                and full["client_key"] == secrets.client_key
            )
        carols = http.get("/api/v1/queue", headers=bearer("carol")).json()
        assert entry_of(carols, daves)["job"]["visibility"] == "other"
        daves_view = http.get("/api/v1/queue", headers=bearer("dave"))
        assert_absent(daves_view.content, secrets, "dave's GET /queue")
        assert entry_of(daves_view.json(), daves)["job"]["task_name"] == "daves-task"
        own_page = http.get("/ui/queue", headers=bearer("alice"))
        assert secrets.task_name in own_page.text

    # The CLI shows what the API gave it: for bob, no content of alice's job.
    from hai_airflow.cli.main import app as hai_cli  # here: the API checks above run without the CLI

    env = {"HAI_SERVER": server.url, "HAI_TOKEN": TOKENS["bob"], "HAI_HOME": str(tmp_path / "bob-home")}
    shown = CliRunner().invoke(hai_cli, ["queue", "--json"], env=env, catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    assert_absent(shown.stdout, secrets, "bob's `hai queue --json`")
    assert entry_of(json.loads(shown.stdout), waiting)["job"]["owner"] == OTHER_USERS_JOB
    table = CliRunner().invoke(hai_cli, ["queue"], env=env, catch_exceptions=False)
    assert table.exit_code == 0 and OTHER_USERS_JOB in table.stdout
    assert_absent(table.stdout, secrets, "bob's `hai queue`")
    tasks = CliRunner().invoke(hai_cli, ["task", "--all", "--json"], env=env, catch_exceptions=False)
    assert tasks.exit_code == 0 and json.loads(tasks.stdout) == []


def test_metrics_need_the_metrics_token_or_a_platform_admin(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        missing = http.get("/metrics")
        assert missing.status_code == 401 and missing.json()["field"] == "Authorization"
        wrong = http.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}x"})
        assert wrong.status_code == 401, wrong.text
        user = http.get("/metrics", headers=bearer("bob"))
        assert user.status_code == 403 and "platform admin" in user.json()["error"]
        assert user.json()["field"] == "Authorization" and "metrics_token" in user.json()["fix"]
        for refused in (missing, wrong, user):
            assert "hai_queued_jobs" not in refused.text and "vision" not in refused.text
        for token in (METRICS_TOKEN, TOKENS["admin"]):
            ok = http.get("/metrics", headers={"Authorization": f"Bearer {token}"})
            assert ok.status_code == 200 and "hai_gpus_free" in ok.text
        # The metrics token is for Prometheus only: the API does not take it.
        assert (
            http.get("/api/v1/jobs", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).status_code == 401
        )


# ---- the dashboard inside hai serve -------------------------------------------------------------------

PAGE_LOADS = 50
API_ANSWERS_WITHIN = 5.0
API_PROBES = 20


@pytest.fixture(scope="module")
def busy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """SQLite server with a running job and three waiting ones, so a queue page makes several API calls."""
    root = tmp_path_factory.mktemp("busy")
    code = root / "code"
    code.mkdir()
    with LiveServer(root / "hai", TEST_CONFIG).start() as live:
        with live.client(TOKENS["alice"]) as alice:
            for i in range(4):
                alice.submit(
                    StandaloneJobSpec(
                        task_name=f"j{i}", code_path=str(code), cmd="sleep 120", resource_pkg=457
                    )
                )
        yield live


def test_many_dashboard_loads_never_starve_the_api(busy_server: LiveServer) -> None:
    statuses: list[int] = []
    start = threading.Barrier(PAGE_LOADS + 1)

    def load_page() -> None:
        with httpx.Client(base_url=busy_server.url, timeout=120) as browser:
            start.wait()
            statuses.append(browser.get("/ui/queue", headers=bearer("alice")).status_code)

    loaders = [threading.Thread(target=load_page) for _ in range(PAGE_LOADS)]
    for t in loaders:
        t.start()
    latencies: list[float] = []
    with httpx.Client(base_url=busy_server.url, timeout=120, headers=bearer("bob")) as api:
        api.get("/api/v1/whoami")  # connected before the storm, so only the answers are timed
        start.wait()
        # Ask again and again while the pages load: any answer held up by them counts.
        while len(latencies) < API_PROBES and (not latencies or any(t.is_alive() for t in loaders)):
            time.sleep(0.3)
            t0 = time.monotonic()
            answer = api.get("/api/v1/jobs")
            latencies.append(time.monotonic() - t0)
            assert answer.status_code == 200, answer.text
    for t in loaders:
        t.join()
    slowest = max(latencies)
    assert slowest < API_ANSWERS_WITHIN, (
        f"GET /api/v1/jobs took {slowest:.1f} s during {PAGE_LOADS} page loads"
    )
    assert statuses == [200] * PAGE_LOADS


def test_the_dashboard_renders_behind_a_tls_proxy(busy_server: LiveServer) -> None:
    # hai serve trusts X-Forwarded-* from 127.0.0.1 (uvicorn's default; FORWARDED_ALLOW_IPS widens it),
    # so this request looks to the dashboard as if the viewer came in over https.
    proxied = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"}
    with httpx.Client(base_url=busy_server.url, timeout=30, headers=proxied) as browser:
        signed_in = browser.post("/ui/sign-in", data={"token": TOKENS["alice"], "next": "/ui/queue"})
        assert signed_in.status_code == 303, signed_in.text
        assert "secure" in signed_in.headers["set-cookie"].lower(), "the server saw the viewer's https"
        page = browser.get("/ui/queue", headers=bearer("alice"))
    assert page.status_code == 200, page.text
    assert "<h1>Queue</h1>" in page.text and "j1" in page.text
    assert f"from https://127.0.0.1:{busy_server.port}" in page.text
