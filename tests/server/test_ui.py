"""`hai serve` serves the dashboard at /ui, signed in with the viewer's own token."""

from __future__ import annotations

from pathlib import Path

import httpx

from hai_airflow.spec import StandaloneJobSpec
from tests.support.live_server import TOKENS, LiveServer


def test_ui_shows_the_queue_page_to_a_token_holder(live_server: LiveServer, tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    spec = {"code_path": str(code), "cmd": "sleep 60", "resource_pkg": 457}
    with live_server.client(TOKENS["alice"]) as alice:
        alice.submit(StandaloneJobSpec(task_name="holds-all-gpus", **spec))
        alice.submit(StandaloneJobSpec(task_name="waits-for-gpus", **spec))

    with httpx.Client(base_url=live_server.url, timeout=30, follow_redirects=True) as browser:
        page = browser.get("/ui/", params={"token": TOKENS["admin"]})
        assert page.status_code == 200, page.text
        assert page.history[0].status_code == 303
        assert "token=" not in str(page.url), "the token stays out of the address"
        assert page.url.path == "/ui/queue"
        assert "<h1>Queue</h1>" in page.text
        assert "waits-for-gpus" in page.text
        assert browser.get("/ui/queue").status_code == 200, "the cookie signs the next page in"

    with httpx.Client(base_url=live_server.url, timeout=30) as stranger:
        refused = stranger.get("/ui/queue")
        assert refused.status_code == 401 and "Sign in to hai" in refused.text
    assert "HTTP Request:" not in live_server.log_text(), "httpx logs every dashboard call at INFO"
