"""Server test fixtures: a store on SQLite and on PostgreSQL, the API in-process, a real controller."""

from __future__ import annotations

import contextlib
import json
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from hai_airflow.backends.common import procs
from hai_airflow.backends.local.backend import LocalBackend
from hai_airflow.server.api.app import create_app
from hai_airflow.server.config import ServerConfig, parse_config
from hai_airflow.server.control.controller import Controller
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.provision import apply_config
from hai_airflow.server.store.database import Store
from hai_airflow.server.store.tables import InstanceRow
from tests.support import postgres
from tests.support.live_server import TEST_CONFIG, TOKENS, reap_strays

STORAGE_CONFIG = """
[storages.10111]
path = "{home}/storage/10111"
groups = ["vision"]

[storages.10222]
path = "{home}/storage/10222"
users = ["dave"]
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database: a fresh SQLite file, or the session's PostgreSQL database emptied."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'hai.db'}"
    url: str = request.getfixturevalue("pg_database")
    postgres.reset_database(url)
    return url


def make_config(home: Path, extra: str = "") -> ServerConfig:
    return parse_config((TEST_CONFIG + STORAGE_CONFIG + extra).replace("{home}", str(home)))


class Api:
    """The app in-process (no HTTP server) with a controller that tests step by hand."""

    def __init__(self, ctx: ServerContext, http: TestClient, code: Path):
        self.ctx = ctx
        self.http = http
        self.code = code
        self.controller: Controller | None = None

    def call(self, method: str, path: str, user: str | None = "admin", **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {TOKENS[user]}"} if user else {}
        headers.update(kw.pop("headers", {}))
        url = path if path.startswith("/health") else f"/api/v1{path}"
        return self.http.request(method, url, headers=headers, **kw)

    def get(self, path: str, user: str | None = "admin", **kw: Any) -> httpx.Response:
        return self.call("GET", path, user, **kw)

    def post(self, path: str, user: str | None = "admin", **kw: Any) -> httpx.Response:
        return self.call("POST", path, user, **kw)

    def put(self, path: str, user: str | None = "admin", **kw: Any) -> httpx.Response:
        return self.call("PUT", path, user, **kw)

    def spec(self, **kw: Any) -> dict[str, Any]:
        """A standalone job body; `kw` overrides spec fields (mode=... switches the kind)."""
        spec: dict[str, Any] = {
            "mode": "standalone",
            "task_name": "t",
            "code_path": str(self.code),
            "cmd": "true",
            "resource_pkg": 454,
        }
        if kw.get("mode") == "cpu":
            spec.pop("resource_pkg")
        if kw.get("mode") == "distributed":
            spec.pop("resource_pkg")
            spec.update(workers=2, worker_resource_pkg=457)
        spec.update(kw)
        return spec

    def submit(
        self, user: str = "alice", client_key: str | None = None, expect: int = 201, **spec: Any
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"spec": self.spec(**spec)}
        if client_key is not None:
            body["client_key"] = client_key
        r = self.post("/jobs", user, json=body)
        assert r.status_code == expect, r.text
        out: dict[str, Any] = r.json()
        return out

    def job(self, job_id: int, user: str = "admin") -> dict[str, Any]:
        r = self.get(f"/jobs/{job_id}", user)
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    def with_controller(self) -> Controller:
        backend = LocalBackend({"watch_interval_seconds": 0.05}, self.ctx.home)
        self.controller = Controller(self.ctx, backend)
        return self.controller

    def step(self) -> None:
        assert self.controller is not None
        self.controller.step(force=True)

    def until(self, check: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
        """Step the controller until `check()` holds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.controller is not None:
                self.step()
            if check():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    def until_state(self, job_id: int, *states: str, timeout: float = 15.0) -> dict[str, Any]:
        self.until(lambda: self.job(job_id)["state"] in states, timeout, f"job {job_id} in {states}")
        return self.job(job_id)


def kill_live_instances(store: Store) -> None:
    """SIGKILL the process groups of instances the store still thinks are running (test teardown)."""
    with store.read() as s:
        handles = [
            json.loads(h or "{}")
            for h in s.scalars(
                select(InstanceRow.handle).where(
                    InstanceRow.ended_at.is_(None), InstanceRow.handle.is_not(None)
                )
            )
        ]
    for data in handles:
        for w in data.get("workers", []):
            started = procs.start_time(int(w["pid"]))
            if started is None or started == int(w["start_time"]):  # never a reused pid
                procs.signal_group(int(w["pgid"]), signal.SIGKILL)


@pytest.fixture
def api_factory(db_url: str, tmp_path: Path) -> Iterator[Callable[..., Api]]:
    made: list[Api] = []
    token_key = secrets.token_bytes(32)  # Apis on one database share the key tokens are hashed under

    def make(extra_config: str = "") -> Api:
        home = tmp_path / "home"
        code = tmp_path / "code"
        code.mkdir(exist_ok=True)
        for sid in ("10111", "10222"):
            (home / "storage" / sid).mkdir(parents=True, exist_ok=True)
        config = make_config(home, extra_config)
        store = Store(db_url, token_key)
        store.migrate()
        apply_config(store, config, list(config.nodes))
        ctx = ServerContext(store=store, config=config, home=home, holder_id=f"test:{len(made)}")
        api = Api(ctx, TestClient(create_app(ctx), raise_server_exceptions=False), code)
        made.append(api)
        return api

    yield make
    for api in made:
        if api.controller is not None:
            with contextlib.suppress(Exception):
                api.controller.stop()
        kill_live_instances(api.ctx.store)
        api.http.app.state.submissions.stop()  # the lifespan that would stop it never ran
        api.http.close()
        api.ctx.store.dispose()
        reap_strays(api.ctx.home)


@pytest.fixture
def api(api_factory: Callable[..., Api]) -> Api:
    return api_factory()
