"""A deferrable task fails before submitting when Airflow reports no triggerer; in doubt it defers."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from hai_airflow.operators.triggerer import HEALTH_PATH, no_triggerer, triggerer_down
from tests.airflow.helpers import load_dag, task_states
from tests.support.live_server import LiveServer


@pytest.mark.parametrize(
    ("health", "down"),
    [
        pytest.param({"triggerer": {"status": "healthy"}}, False, id="healthy"),
        pytest.param({"triggerer": {"status": "unhealthy"}}, True, id="stale heartbeat"),
        pytest.param(
            {"triggerer": {"status": None, "latest_triggerer_heartbeat": None}}, True, id="never ran"
        ),
        pytest.param({"scheduler": {"status": "healthy"}}, False, id="no word on the triggerer"),
    ],
)
def test_triggerer_down(health: dict[str, Any], down: bool) -> None:
    assert triggerer_down(health) is down


@pytest.fixture
def health_server() -> Iterator[Callable[[dict[str, Any]], str]]:
    """An HTTP server answering Airflow's health path with the report given; returns its URL."""
    report: dict[str, Any] = {}

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(report).encode()
            self.send_response(200 if self.path == HEALTH_PATH else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def answer(health: dict[str, Any]) -> str:
        report.clear()
        report.update(health)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield answer
    server.shutdown()


def test_no_triggerer_only_on_a_clear_answer(health_server: Callable[[dict[str, Any]], str]) -> None:
    assert no_triggerer(health_server({"triggerer": {"status": "unhealthy"}})) is True
    assert no_triggerer(health_server({"triggerer": {"status": "healthy"}})) is False
    assert no_triggerer("http://127.0.0.1:9") is False, "no API server: defer as asked"
    assert no_triggerer("") is False


def test_a_deferrable_task_fails_fast_without_a_triggerer(
    hai_conn: Callable[..., LiveServer],
    health_server: Callable[[dict[str, Any]], str],
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    server = hai_conn()
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", health_server({"triggerer": {"status": None}}))
    run = load_dag("hai_deferred").test(run_conf={"cmd": "true"})

    assert task_states(run) == {"stage": "failed"}
    assert "Airflow reports no running triggerer" in capfd.readouterr().out
    with server.client() as client:
        assert client.jobs(all=True) == []
