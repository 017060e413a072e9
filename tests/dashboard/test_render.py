"""The pages rendered from a fixed API snapshot, mounted under /ui as `hai serve` mounts them."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from hai_airflow.client import AsyncHaiClient
from hai_airflow.dashboard import data
from hai_airflow.dashboard.app import SignInRequired, create_dashboard_app
from hai_airflow.jobfile import job_file
from hai_airflow.spec import ForecastView
from tests.dashboard import snapshot
from tests.dashboard.dom import Node, parse


def _client_for(transport: httpx.AsyncBaseTransport):  # type: ignore[no-untyped-def]
    async def client_for(request: Request) -> AsyncHaiClient:
        token = request.headers.get("x-test-token")
        if token is None:
            raise SignInRequired("no token", "send one")
        return AsyncHaiClient(server="http://hai.test", token=token, transport=transport)

    return client_for


@pytest.fixture
def snap() -> snapshot.Snapshot:
    return snapshot.build()


@pytest.fixture
def ui(snap: snapshot.Snapshot) -> Iterator[TestClient]:
    outer = FastAPI()
    outer.mount("/ui", create_dashboard_app(_client_for(snapshot.transport(snap)), token_form=True))
    with TestClient(outer, headers={"x-test-token": snapshot.TOKEN}) as client:
        yield client


def page(ui: TestClient, path: str, status: int = 200) -> Node:
    resp = ui.get(path)
    assert resp.status_code == status, resp.text[:2000]
    assert resp.headers["content-type"].startswith("text/html")
    return parse(resp.text)


def test_queue_lists_jobs_in_scheduler_order_with_weights_reasons_and_eta(ui: TestClient) -> None:
    doc = page(ui, "/ui/queue")
    rows = doc.one("table", id="queue").find_all("tr", cls="entry")
    assert [(r.attrs["data-position"], r.attrs["data-job"]) for r in rows] == [
        ("1", "7"),
        ("2", "1"),
        ("3", "4"),
    ]
    high, preempted, pending = rows
    assert "1,000,000,000" in high.text and "deadline -28,000" in high.text
    # job 6 was asked to suspend at +240 s with a 90 s grace period: job 7 can start by +330 s
    assert high.one("td", cls="eta").text.startswith("≈ 2026-11-29 12:05:30")
    assert preempted.one("td", cls="reason").text == "needs 4 V100 GPUs; 0 free"
    assert preempted.one("span", cls="preempted-by").one("a").attrs["href"] == "/ui/jobs/3"
    assert preempted.one("td", cls="behind").one("a").attrs["href"] == "/ui/jobs/2"
    assert "waiting 250" in preempted.text and "lost to suspension 90" in preempted.text
    assert pending.one("td", cls="eta").text.startswith("—")
    running = [
        r.attrs["data-job"] for r in doc.one("table", id="running").find_all("tr") if "data-job" in r.attrs
    ]
    assert running == ["2", "3", "5", "6"]  # longest run time first


def test_user_text_is_escaped(ui: TestClient) -> None:
    raw = ui.get("/ui/queue").text
    assert "&lt;b&gt;resnet&lt;/b&gt;" in raw and "<b>resnet</b>" not in raw


def test_quota_shows_used_against_limit_per_group_and_member(ui: TestClient) -> None:
    doc = page(ui, "/ui/quota")
    nlp = doc.one("section", data_group="nlp")
    bar = nlp.find_all("svg", cls="bar")[0]
    assert (bar.attrs["data-used"], bar.attrs["data-limit"]) == ("6", "16")
    dave = nlp.one("tr", data_user="dave")
    assert {a.attrs["data-job"] for a in dave.find_all("a", cls="using")} == {"3", "7"}
    vision = doc.one("section", data_group="vision")
    alice = vision.one("tr", data_user="alice").one("svg", cls="bar")
    assert (alice.attrs["data-used"], alice.attrs["data-limit"]) == ("0", "8")
    bob = vision.one("tr", data_user="bob")
    assert bob.one("svg", cls="bar").attrs["data-limit"] == "" and "the group's applies" in bob.text
    assert "You are alice in group vision" in " ".join(doc.one("p", id="me").text.split())


def test_nodes_grid_colours_each_gpu_by_its_holder(ui: TestClient) -> None:
    doc = page(ui, "/ui/nodes")
    a = doc.one("section", data_node="gpu-a")
    holders = {g.attrs["data-gpu"]: g.attrs["data-job"] for g in a.find_all("g", cls="gpu")}
    assert holders == {"0": "3", "1": "3", "2": "3", "3": "3", "4": "2", "5": "2", "6": "2", "7": "2"}
    fills = {g.attrs["data-job"]: g.one("rect").attrs["fill"] for g in a.find_all("g", cls="gpu")}
    assert fills["3"] != fills["2"]
    b = doc.one("section", data_node="gpu-b")
    assert b.one("span", cls="free-blocks").text == "3"
    assert b.one("g", data_gpu="3").attrs["data-job"] == "" and "free" in b.one("g", data_gpu="3").text
    assert "1 of 12 GPUs free" in doc.text


def test_nodes_say_which_take_no_new_jobs_and_who_drained_them(ui: TestClient) -> None:
    doc = page(ui, "/ui/nodes")
    states = {s.attrs["data-node"]: s.one("span", cls="node-state").text for s in doc.find_all("section")}
    assert states == {"gpu-a": "ready", "gpu-b": "draining"}
    assert doc.one("section", data_node="gpu-a").find_all("p", cls="drained") == []
    drained = " ".join(doc.one("section", data_node="gpu-b").one("p", cls="drained").text.split())
    assert drained == (
        "No new job starts here; the jobs on it run to their end: drained by admin at 2026-11-29 12:06:40 "
        "(fan <noise>)."
    )


def test_job_page_shows_run_suspension_resume_and_checkpoint(ui: TestClient) -> None:
    doc = page(ui, "/ui/jobs/5")
    timeline = doc.one("svg", id="timeline")
    segments = [
        (g.attrs["data-kind"], g.attrs["data-preempted-by"], g.attrs["data-resume"])
        for g in timeline.find_all("g", cls="segment")
    ]
    assert segments == [
        ("queued", "", "false"),
        ("run", "9", "false"),
        ("suspended", "9", "false"),
        ("run", "", "true"),
    ]
    assert [m.attrs["data-kind"] for m in timeline.find_all("g", cls="mark")] == ["checkpoint", "suspending"]
    assert doc.one("pre", id="log").text == "resumed from /m/5/ckpt-51.pt\nstep 7\n"
    assert doc.one("pre", id="log").attrs["data-src"] == "/ui/jobs/5/log?instance=52"
    assert doc.one("dd", id="placement").text == "gpu-b: GPUs 0"
    first = page(ui, "/ui/jobs/5?instance=51")
    assert first.one("pre", id="log").text == "step 0\n"


def test_job_page_shows_the_spec_as_a_job_file_escaped(ui: TestClient, snap: snapshot.Snapshot) -> None:
    # Who may see it is the API's answer for the whole page (tests/security/test_cross_user.py).
    spec = {**snap.jobs[1].spec, "task_name": "<b>resnet</b>", "cmd": "python3 t.py --tag '</pre><script>'"}
    snap.jobs[1] = snap.jobs[1].model_copy(update={"spec": spec})
    raw = ui.get("/ui/jobs/1").text
    assert "</pre><script>'" not in raw and "&lt;/pre&gt;&lt;script&gt;" in raw
    assert parse(raw).one("pre", id="spec").text == job_file(spec)


def test_log_tail_says_whether_the_instance_ended(ui: TestClient) -> None:
    live = ui.get("/ui/jobs/5/log", params={"instance": 52})
    assert (live.status_code, live.headers["x-hai-instance-ended"]) == (200, "0")
    done = ui.get("/ui/jobs/5/log", params={"instance": 51})
    assert (done.headers["x-hai-instance-ended"], done.text) == ("1", "step 0\n")
    assert ui.get("/ui/jobs/1/log", params={"instance": 51}).status_code == 404


@pytest.mark.parametrize(
    ("path", "status", "words"),
    [
        pytest.param("/ui/jobs/99", 404, "task 99 not found", id="unknown job"),
        pytest.param("/ui/jobs?id=abc", 400, "is not a job id", id="bad job id in the search box"),
    ],
)
def test_errors_are_pages_that_say_what_failed(ui: TestClient, path: str, status: int, words: str) -> None:
    doc = page(ui, path, status)
    assert words in doc.one("div", id="error").text


def test_the_task_list_filters_by_state_and_user_and_pages_newest_first(
    ui: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def listed(doc: Node) -> list[str]:
        rows = doc.one("table", id="jobs").find_all("tr")
        return [r.attrs["data-job"] for r in rows if "data-job" in r.attrs]

    everything = listed(page(ui, "/ui/jobs"))
    assert everything == sorted(everything, key=int, reverse=True) and len(everything) >= 5
    running = listed(page(ui, "/ui/jobs?state=running"))
    assert running and set(running) < set(everything)
    assert page(ui, "/ui/jobs?user=nobody").one("p", id="jobs-empty").text == "No task matches."
    monkeypatch.setattr(data, "LIST_PAGE", 2)
    first = page(ui, "/ui/jobs")
    older = first.one("a", id="older").attrs["href"]
    assert listed(first) == everything[:2] and older.endswith(f"before={everything[1]}")
    assert listed(page(ui, older)) == everything[2:4]
    assert "before='x' is not a job id" in page(ui, "/ui/jobs?before=x", 400).text


def test_job_search_redirects_to_the_job(ui: TestClient) -> None:
    resp = ui.get("/ui/jobs", params={"id": "#5"}, follow_redirects=False)
    assert (resp.status_code, resp.headers["location"]) == (303, "/ui/jobs/5")
    assert ui.get("/ui/", follow_redirects=False).headers["location"] == "/ui/queue"


def test_missing_or_refused_credentials_get_a_sign_in_page(ui: TestClient) -> None:
    missing = ui.get("/ui/queue", headers={"x-test-token": ""})
    assert missing.status_code == 401 and "Sign in to hai" in missing.text
    refused = ui.get("/ui/queue", headers={"x-test-token": "wrong"})
    assert refused.status_code == 401 and "unknown API token" in refused.text
    assert 'name="token"' in refused.text


def test_an_unreachable_server_is_a_502_page() -> None:
    async def down(_request: Request) -> AsyncHaiClient:
        return AsyncHaiClient(server="http://127.0.0.1:9", token="t", timeout=2)

    with TestClient(create_dashboard_app(down)) as client:
        resp = client.get("/queue")
    assert resp.status_code == 502 and "cannot reach the hai server at http://127.0.0.1:9" in resp.text


def test_queue_and_job_pages_show_the_forecast(ui: TestClient, snap: snapshot.Snapshot) -> None:
    start = datetime(2026, 11, 29, 14, 20, tzinfo=UTC)
    forecast = ForecastView(start_at=start, source="history")
    snap.queue[2] = snap.queue[2].model_copy(update={"forecast": forecast})
    snap.jobs[4] = snap.jobs[4].model_copy(update={"forecast": forecast})
    rows = page(ui, "/ui/queue").one("table", id="queue").find_all("tr", cls="entry")
    assert rows[2].one("td", cls="eta").text.startswith("~ 2026-11-29 14:20:00")
    assert "forecast with estimated runtimes" in rows[2].one("td", cls="eta").text
    assert page(ui, "/ui/jobs/4").one("dd", id="forecast").text == "starts ~ 2026-11-29 14:20:00 (history)"


def test_a_resizable_job_shows_its_workers_now_of_asked_and_its_least(
    ui: TestClient, snap: snapshot.Snapshot
) -> None:
    shrunk = {"mode": "distributed", "workers": 4, "gpus": 16, "min_workers": 1, "size": 2}
    snap.jobs[2] = snap.jobs[2].model_copy(update=shrunk)
    assert page(ui, "/ui/jobs/2").one("span", id="workers").text == "2/4 workers (min 1)"
    row = page(ui, "/ui/jobs").one("tr", data_job="2")
    assert row.one("span", cls="workers").text == "2/4 workers (min 1)"
    running = page(ui, "/ui/queue").one("table", id="running").one("tr", data_job="2")
    assert running.one("span", cls="workers").text == "2/4 workers (min 1)"


def test_a_job_that_never_resizes_shows_its_workers_as_before(
    ui: TestClient, snap: snapshot.Snapshot
) -> None:
    snap.jobs[2] = snap.jobs[2].model_copy(
        update={"mode": "distributed", "workers": 4, "gpus": 16, "size": 4}
    )
    assert "16 GPUs V100 · 4 workers" in page(ui, "/ui/jobs/2").one("dl", cls="facts").text
    row = page(ui, "/ui/jobs").one("tr", data_job="2")
    assert row.find_all("span", cls="workers") == []
