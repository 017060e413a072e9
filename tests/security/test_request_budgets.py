"""Budgets per user and per request against a live server: a usage window has a length limit, the queue
view never plans per request, a user's waiting jobs have a cap, a forecast keeps another user's time
limit private, an array's numbers are bounded, and a victim's own grace is bounded by the platform."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.security.cli import hai
from tests.support.latency import assert_answered_fast
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer, start_server

LIMITS = """
[limits]
pending_jobs_per_user = 5
max_grace_seconds = 2
"""
"""Small budgets, so that a test reaches them in a few requests."""


GRAIN_SECONDS = 900.0
"""How coarse a forecast resting on another user's job is shown (`forecasting.GRAIN_SECONDS`)."""


def auth(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[user]}"}


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("code")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One live server (SQLite) with the small budgets of LIMITS."""
    with start_server(tmp_path_factory.mktemp("budgets") / "hai", TEST_CONFIG + LIMITS) as live:
        yield live


@pytest.fixture
def fresh(server: LiveServer) -> LiveServer:
    """The module's server with no unfinished job left by an earlier test."""
    server.cancel_all()
    return server


def spec(code: Path, **fields: Any) -> dict[str, Any]:
    """A standalone job taking the node's 8 GPUs (so the next one waits), low priority."""
    return {"mode": "standalone", "task_name": "budget", "code_path": str(code), "cmd": "sleep 600",
            "resource_pkg": 457, **fields}  # fmt: skip


def submit(server: LiveServer, user: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/api/v1/jobs", json=body, headers=auth(user), timeout=60)


def created(server: LiveServer, user: str, body: dict[str, Any]) -> dict[str, Any]:
    r = submit(server, user, body)
    assert r.status_code == 201, r.text
    job: dict[str, Any] = r.json()
    return job


def get(server: LiveServer, user: str, path: str, **kw: Any) -> httpx.Response:
    return httpx.get(f"{server.url}/api/v1{path}", headers=auth(user), timeout=kw.pop("timeout", 60), **kw)


def job(server: LiveServer, user: str, job_id: int) -> dict[str, Any]:
    r = get(server, user, f"/jobs/{job_id}")
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def until(check: Any, what: str, timeout: float = 60.0) -> Any:
    """Poll `check()` until it gives something true; that value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def state_is(server: LiveServer, job_id: int, *states: str) -> bool:
    return job(server, "admin", job_id)["state"] in states


def job_count(server: LiveServer) -> int:
    return len(get(server, "admin", "/jobs", params={"all": True, "limit": 100_000}).json())


def refusal(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text[:2000]
    body: dict[str, Any] = r.json()
    assert set(body) == {"error", "field", "fix"} and body["error"] and body["fix"], body
    return body


# ---- finding 4: the usage window --------------------------------------------------------------


@pytest.mark.parametrize("path", ["/usage/history", "/usage"])
def test_a_thousand_year_usage_window_is_refused_at_once(server: LiveServer, path: str) -> None:
    began = time.monotonic()
    r = get(server, "alice", path, params={"since": "1500-01-01", "until": "2500-01-01"}, timeout=10)
    body = refusal(r, 422)
    assert time.monotonic() - began < 5
    assert body["field"] == "since"
    assert "[limits] usage_window_days = 400" in body["error"] and "365,243 days" in body["error"]
    assert "at most 400 days apart" in body["fix"]


def test_the_longest_usage_window_allowed_answers_quickly_and_small(server: LiveServer) -> None:
    began = time.monotonic()
    r = get(server, "admin", "/usage/history", params={"since": "2025-01-01", "until": "2026-02-04"})
    assert r.status_code == 200, r.text[:500]
    assert time.monotonic() - began < 5
    assert len(r.content) < 200_000
    assert len(r.json()["days"]) == 399 and len(r.json()["waiting"]) == 399 * 24


def test_a_usage_flood_leaves_another_users_list_fast(server: LiveServer) -> None:
    """20 of alice's concurrent usage histories over the longest window allowed, and 20 over a
    thousand years (refused): bob's list answers within 1 s all along."""
    longest = {"since": "2025-01-01", "until": "2026-02-04"}
    too_long = {"since": "1500-01-01", "until": "2500-01-01"}
    latencies: list[float] = []
    with ThreadPoolExecutor(40) as pool:
        flood = [
            pool.submit(get, server, "alice", "/usage/history", params=window, timeout=300)
            for window in [longest] * 20 + [too_long] * 20
        ]
        deadline = time.monotonic() + 120
        while not all(f.done() for f in flood) and time.monotonic() < deadline:
            began = time.monotonic()
            assert get(server, "bob", "/jobs", timeout=300).status_code == 200
            latencies.append(time.monotonic() - began)
        codes = sorted(f.result().status_code for f in flood)
    assert codes == [200] * 20 + [422] * 20
    assert_answered_fast(latencies, "bob")


def test_hai_usage_says_how_to_fix_a_window_too_long(server: LiveServer) -> None:
    refused = hai(server, "alice", "usage", "--since", "1500-01-01", "--until", "2500-01-01")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("Error: ") and "[limits] usage_window_days = 400" in refused.stderr
    assert "Traceback" not in refused.stderr
    huge = hai(server, "alice", "usage", "--since", "99999999999d")
    assert huge.returncode == 2 and "Traceback" not in huge.stderr, huge.stderr
    fine = hai(server, "alice", "usage", "--since", "7d", "-o", "json")
    assert fine.returncode == 0, fine.stderr


# ---- finding 10: array numbers -----------------------------------------------------------------


def test_an_array_limit_past_any_integer_is_a_422_naming_array(server: LiveServer, code: Path) -> None:
    before = job_count(server)
    body = refusal(submit(server, "alice", {"spec": spec(code), "array": "0-1%9223372036854775808"}), 422)
    assert body["field"] == "array" and "1 to 1000" in body["error"]
    assert job_count(server) == before


ARRAY_FUZZ = [
    "9223372036854775808", "0-9223372036854775808", "0-1:9223372036854775808", "1%99999999999999999999",
    "0-1%1001", "0-1%0", "%", "0-", "-1", ",", "0,,1", "0-1:0", "5-1", "٣", "0-1%٣", "0-1%²", "1" * 200,
    "0-999999", "0-1000", " 1", "0-1%1%1", "0x10", "1e3", "0-1:-1", "\u0000", "0-1\n",
]  # fmt: skip


def test_no_array_value_makes_a_server_error(server: LiveServer, code: Path) -> None:
    before = job_count(server)
    for text in ARRAY_FUZZ:
        r = submit(server, "alice", {"spec": spec(code, cmd="true"), "array": text})
        assert r.status_code == 422, (text, r.status_code, r.text[:300])
    assert job_count(server) == before


# ---- finding 6: the pending-jobs cap -------------------------------------------------------------


def test_waiting_jobs_past_the_cap_get_429_and_nothing_is_made(fresh: LiveServer, code: Path) -> None:
    server = fresh
    running = created(server, "alice", {"spec": spec(code)})
    until(lambda: state_is(server, running["id"], "RUNNING"), "alice's first job to run")
    waiting = [created(server, "alice", {"spec": spec(code)})["id"] for _ in range(5)]
    before = job_count(server)

    body = refusal(submit(server, "alice", {"spec": spec(code)}), 429)
    assert "[limits] pending_jobs_per_user = 5" in body["error"]
    assert "alice has 5 tasks waiting" in body["error"]
    assert "cancel" in body["fix"]
    body = refusal(submit(server, "alice", {"spec": spec(code), "array": "0-1"}), 429)
    assert "2 more tasks" in body["error"]
    assert job_count(server) == before  # neither the job nor any task of the array was made

    created(server, "bob", {"spec": spec(code)})  # a budget per user: bob's own is untouched
    cancel = httpx.post(f"{server.url}/api/v1/jobs/{waiting[0]}/cancel", headers=auth("alice"))
    assert cancel.status_code == 200, cancel.text
    until(lambda: state_is(server, waiting[0], "CANCELLED"), "the cancel")
    created(server, "alice", {"spec": spec(code)})


def test_held_jobs_count_as_waiting(fresh: LiveServer, code: Path) -> None:
    server = fresh
    blocker = created(server, "dave", {"spec": spec(code)})
    until(lambda: state_is(server, blocker["id"], "RUNNING"), "dave's job to run")
    queued = [created(server, "carol", {"spec": spec(code)})["id"] for _ in range(5)]
    for job_id in queued[:2]:
        r = httpx.post(f"{server.url}/api/v1/jobs/{job_id}/hold", headers=auth("carol"))
        assert r.status_code == 200, r.text
    body = refusal(submit(server, "carol", {"spec": spec(code)}), 429)
    assert "carol has 5 tasks waiting" in body["error"]


# ---- finding 9: a forecast and another user's time limit ---------------------------------------


def _at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_a_forecast_never_tells_another_users_time_limit(fresh: LiveServer, code: Path) -> None:
    server = fresh
    alices = created(server, "alice", {"spec": spec(code, time_limit_seconds=3001)})
    until(lambda: state_is(server, alices["id"], "RUNNING"), "alice's job to run")
    daves = created(server, "dave", {"spec": spec(code)})

    def forecast(user: str) -> dict[str, Any] | None:
        f = job(server, user, daves["id"])["forecast"] if user == "dave" else None
        if user != "dave":
            entries = [e for e in get(server, user, "/queue").json() if e["job"]["id"] == daves["id"]]
            f = entries[0]["forecast"] if entries else None
        return f if f and f["start_at"] else None

    own = until(lambda: forecast("dave"), "dave's forecast")
    assert own["source"] is None  # not `limit`: that is alice's to know
    start = _at(own["start_at"])
    assert start % GRAIN_SECONDS == 0 and time.time() + 2900 < start <= time.time() + 3001 + GRAIN_SECONDS
    queued = next(e for e in get(server, "dave", "/queue").json() if e["job"]["id"] == daves["id"])
    assert queued["forecast"]["source"] is None and queued["forecast"]["start_at"] == own["start_at"]
    # Bob sees dave's job as another user's, resting on alice's: the same coarse time, no source.
    assert forecast("bob")["start_at"] == own["start_at"]  # type: ignore[index]
    # Alice may know her own limit: her view of dave's start is the exact one.
    exact = _at(forecast("alice")["start_at"])  # type: ignore[index]
    assert start - GRAIN_SECONDS < exact <= start
    assert job(server, "alice", alices["id"])["forecast"]["source"] == "limit"


# ---- finding 13: the grace a victim gets -------------------------------------------------------


def test_a_victims_own_grace_is_cut_to_the_platforms_limit(fresh: LiveServer, code: Path) -> None:
    server = fresh
    # It ignores the notice and SIGTERM: only the kill at the end of its grace stops it.
    stubborn = "trap '' TERM; while true; do sleep 1; done"
    victim = created(server, "alice", {"spec": spec(code, cmd=stubborn, elastic=True, grace_seconds=3600)})
    until(lambda: state_is(server, victim["id"], "RUNNING"), "the victim to run")
    page = job(server, "alice", victim["id"])
    assert page["spec"]["grace_seconds"] == 2  # what it really gets, on its page
    assert "its grace of 3600 s is cut to [limits] max_grace_seconds = 2 s" in page["events"][0]["reason"]

    asked = time.monotonic()
    high = created(server, "dave", {"spec": spec(code, max_schedule=4)})
    until(lambda: state_is(server, high["id"], "RUNNING"), "the high-priority job to start", timeout=30)
    assert time.monotonic() - asked < 30
    assert job(server, "alice", victim["id"])["state"] == "SUSPENDED"


# ---- finding 5: the queue view under a flood ---------------------------------------------------


@pytest.fixture
def crowded(tmp_path: Path, code: Path) -> Iterator[LiveServer]:
    """A server (default budgets) with 2,000 of alice's jobs queued behind one running."""
    with start_server(tmp_path / "hai", TEST_CONFIG) as live:
        for _ in range(2):
            created(live, "alice", {"spec": spec(code), "array": "0-999"})
        until(lambda: len(get(live, "admin", "/queue").json()) == 1999, "the queue of 1,999", timeout=120)
        yield live


HIGH_START_SECONDS = 15.0
"""A high-priority job that preempts a non-elastic one starts within a few controller cycles (about
3 s on an idle machine); this bound leaves room for a loaded CI machine, never for a flood's delay."""


def test_a_queue_flood_leaves_another_users_list_and_high_job_fast(crowded: LiveServer, code: Path) -> None:
    """20 of alice's concurrent `GET /queue` over 2,000 queued jobs: bob's list answers within 1 s
    all along, and his high-priority job, submitted as the flood starts, preempts and starts in time."""
    server = crowded
    latencies: list[float] = []
    with ThreadPoolExecutor(20) as pool:
        flood = [pool.submit(get, server, "alice", "/queue", timeout=300) for _ in range(20)]
        submitted = time.monotonic()
        high = created(server, "bob", {"spec": spec(code, task_name="urgent", max_schedule=4)})
        started: float | None = None
        deadline = time.monotonic() + 120
        while (started is None or not all(f.done() for f in flood)) and time.monotonic() < deadline:
            began = time.monotonic()
            r = get(server, "bob", "/jobs", timeout=300)
            latencies.append(time.monotonic() - began)
            assert r.status_code == 200
            if started is None and {j["id"]: j["state"] for j in r.json()}.get(high["id"]) == "RUNNING":
                started = time.monotonic() - submitted
        answers = [f.result() for f in flood]
    assert all(a.status_code == 200 and len(a.json()) >= 1999 for a in answers)
    assert_answered_fast(latencies, "bob")
    assert started is not None and started < HIGH_START_SECONDS, (
        f"bob's high-priority job started after {started}"
    )
