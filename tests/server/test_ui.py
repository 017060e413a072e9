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
        asked = browser.get("/ui/queue")
        assert asked.status_code == 401 and 'action="/ui/sign-in"' in asked.text
        page = browser.post("/ui/sign-in", data={"token": TOKENS["admin"], "next": "/ui/queue"})
        assert page.status_code == 200, page.text
        assert page.history[0].status_code == 303
        assert page.url.path == "/ui/queue"
        assert "<h1>Queue</h1>" in page.text
        assert "waits-for-gpus" in page.text
        assert browser.get("/ui/queue").status_code == 200, "the cookie signs the next page in"

    with httpx.Client(base_url=live_server.url, timeout=30) as stranger:
        refused = stranger.get("/ui/queue")
        assert refused.status_code == 401 and "Sign in to hai" in refused.text
    assert "HTTP Request:" not in live_server.log_text(), "httpx logs every dashboard call at INFO"


def test_a_link_or_another_sites_form_cannot_sign_a_viewer_in(live_server: LiveServer) -> None:
    """Login CSRF (issue 37, finding 12): a token in the address signs nobody in, a token the API does
    not accept sets no cookie, and a sign-in posted from another site is refused."""
    with httpx.Client(base_url=live_server.url, timeout=30, follow_redirects=True) as victim:
        linked = victim.get("/ui/queue", params={"token": TOKENS["dave"]})
        assert linked.status_code == 401 and not victim.cookies
        wrong = victim.post("/ui/sign-in", data={"token": "attacker-made-up", "next": "/ui/queue"})
        assert wrong.status_code == 401 and "unknown API token" in wrong.text and not victim.cookies
        for headers in ({"Origin": "http://evil.invalid"}, {"Sec-Fetch-Site": "cross-site"}):
            forged = victim.post("/ui/sign-in", data={"token": TOKENS["dave"]}, headers=headers)
            assert forged.status_code == 403 and not victim.cookies, headers
        # after signing in, `next` only ever leads to a page of this dashboard
        away = victim.post(
            "/ui/sign-in", data={"token": TOKENS["dave"], "next": "//evil.invalid/x"}, follow_redirects=False
        )
        assert away.status_code == 303 and away.headers["location"] == "/ui/"
