"""The dashboard in headless Chromium against a live `hai serve`, standalone and inside Airflow."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.dashboard import browser
from tests.dashboard.airflow_api import AirflowApiServer
from tests.dashboard.scenario import Scenario, dashboard_url, preempt, wait_job
from tests.support.live_server import TEST_CONFIG, TOKENS, start_server

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(browser.missing() is not None, reason=str(browser.missing())),
]

README_SHOTS = Path(__file__).parent / "screenshots"
"""Where `HAI_UPDATE_SCREENSHOTS=1` copies one PNG per page for the README."""


AIRFLOW_SERVICE = """
[[users]]
name = "airflow"
token = "airflow-token"
acts_for = ["admin", "dave"]
"""
"""The identity Airflow's connection holds: it acts for the signed-in Airflow user's hai account."""
USER_MAP = {"admin": "admin", "viewer": "dave", "dag_test": "admin"}
"""Airflow user -> hai user; `airflow dags test` runs are triggered by "dag_test"."""


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


def keep(driver: Any, shots: Path, name: str, max_height: int = 1500) -> Path:
    path = browser.screenshot(driver, shots / f"{name}.png", max_height=max_height)
    assert path.stat().st_size > 5_000, f"{name}.png looks empty"
    if os.environ.get("HAI_UPDATE_SCREENSHOTS") == "1":
        README_SHOTS.mkdir(exist_ok=True)
        shutil.copyfile(path, README_SHOTS / f"{name}.png")
    return path


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    root = tmp_path_factory.mktemp("hai")
    with (
        start_server(root / "home", TEST_CONFIG + AIRFLOW_SERVICE) as server,
        dashboard_url(server, root) as ui,
    ):
        yield preempt(server, ui, root / "code")


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with browser.chromium() as d:
        yield d


def cells(driver: Any, css: str, attr: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [e.get_attribute(attr) for e in driver.find_elements(By.CSS_SELECTOR, css)]


def sign_in(driver: Any, scenario: Scenario, path: str) -> None:
    """Open `path`; when it asks for a token, paste the admin's into its sign-in form."""
    from selenium.webdriver.common.by import By

    driver.get(f"{scenario.ui}{path}")
    form = driver.find_elements(By.ID, "sign-in")
    if form:
        form[0].find_element(By.NAME, "token").send_keys(TOKENS["admin"])
        form[0].submit()
        browser.wait_until(lambda: not driver.find_elements(By.ID, "sign-in"), what="the signed-in page")


def test_sign_in_with_the_platform_token_once_then_a_cookie(scenario: Scenario, driver: Any) -> None:
    from selenium.webdriver.common.by import By

    bare = httpx.get(f"{scenario.ui}/queue", timeout=30)
    assert bare.status_code == 401 and "Sign in to hai" in bare.text
    wrong = httpx.get(f"{scenario.ui}/queue", headers={"Authorization": "Bearer nope"}, timeout=30)
    assert wrong.status_code == 401 and "unknown API token" in wrong.text
    driver.delete_all_cookies()
    driver.get(f"{scenario.ui}/queue?token={TOKENS['admin']}")  # a link carrying a token signs nobody in
    assert driver.find_element(By.ID, "error").is_displayed() and driver.get_cookie("hai_ui_token") is None
    sign_in(driver, scenario, "/queue")
    assert driver.current_url == f"{scenario.ui}/queue"
    cookie = driver.get_cookie("hai_ui_token")
    assert cookie is not None and cookie["httpOnly"] and cookie["value"] == TOKENS["admin"]
    assert driver.find_elements(By.ID, "queue")


def test_queue_page_lists_jobs_in_scheduler_order_with_reasons(
    scenario: Scenario, driver: Any, shots: Path
) -> None:
    from selenium.webdriver.common.by import By

    sign_in(driver, scenario, "/queue")
    with scenario.server.client() as admin:
        api = admin.queue()
    rows = driver.find_elements(By.CSS_SELECTOR, "table#queue tr.entry")
    order = [int(r.get_attribute("data-job")) for r in rows]
    # the suspended job waited longer (and lost work), so it is served before the newer pending one
    assert order == [scenario.victim, scenario.pending] == [e.job.id for e in api]
    for row, entry in zip(rows, api, strict=True):
        assert row.find_element(By.CSS_SELECTOR, "td.reason").text == entry.reason
    victim = rows[0]
    assert victim.find_element(By.CSS_SELECTOR, ".preempted-by a").text == f"#{scenario.preemptor}"
    assert "lost to suspension" in victim.find_element(By.CSS_SELECTOR, "td.weight").text
    running = cells(driver, "table#running tr[data-job]", "data-job")
    assert sorted(map(int, running)) == sorted([scenario.other, scenario.preemptor])
    keep(driver, shots, "queue")


def test_quota_page_shows_used_against_limits(scenario: Scenario, driver: Any, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    sign_in(driver, scenario, "/quota")

    def bar(css: str) -> tuple[str, str]:
        e = driver.find_element(By.CSS_SELECTOR, css)
        return e.get_attribute("data-used"), e.get_attribute("data-limit")

    assert bar("section[data-group=nlp] > svg.bar") == ("4", "16")
    assert bar("section[data-group=nlp] tr[data-user=dave] svg.bar") == ("4", "")
    assert bar("section[data-group=vision] > svg.bar") == ("0", "8")
    assert bar("section[data-group=vision] tr[data-user=alice] svg.bar") == ("0", "8")
    users = cells(driver, "section[data-group=nlp] tr[data-user=dave] a.using", "data-job")
    assert users == [str(scenario.preemptor)]
    assert "4 / 16 GPUs" in driver.find_element(By.CSS_SELECTOR, "section[data-group=nlp]").text
    keep(driver, shots, "quota")


def test_nodes_grid_shows_the_preemptor_on_the_victims_former_gpus(
    scenario: Scenario, driver: Any, shots: Path
) -> None:
    sign_in(driver, scenario, "/nodes")
    with scenario.server.client() as admin:
        first_run = admin.instances(scenario.victim)[0]
    (victim_gpus,) = [w.gpus for w in first_run.placement]
    assert first_run.preempted_by == scenario.preemptor and len(victim_gpus) == 4
    gpus = cells(driver, "section[data-node=node1] g.gpu", "data-gpu")
    jobs = cells(driver, "section[data-node=node1] g.gpu", "data-job")
    holders = dict(zip(map(int, gpus), jobs, strict=True))
    assert {g for g, j in holders.items() if j == str(scenario.preemptor)} == set(victim_gpus)
    assert {g for g, j in holders.items() if j == str(scenario.other)} == set(range(8)) - set(victim_gpus)
    fills = cells(driver, "section[data-node=node1] g.gpu rect", "fill")
    assert len(set(fills)) == 2
    keep(driver, shots, "nodes")


def test_job_page_shows_run_suspended_resumed_and_follows_the_log(
    scenario: Scenario, driver: Any, shots: Path
) -> None:
    from selenium.webdriver.common.by import By

    scenario.release.touch()
    with scenario.server.client() as admin:
        wait_job(admin, scenario.preemptor, "SUCCEEDED")
        wait_job(admin, scenario.victim, "RUNNING")
    sign_in(driver, scenario, f"/jobs/{scenario.victim}")
    segments = [
        (g.get_attribute("data-kind"), g.get_attribute("data-preempted-by"), g.get_attribute("data-resume"))
        for g in driver.find_elements(By.CSS_SELECTOR, "svg#timeline g.segment")
        if g.get_attribute("data-kind") != "queued"
    ]
    assert segments == [
        ("run", str(scenario.preemptor), "false"),
        ("suspended", str(scenario.preemptor), "false"),
        ("run", "", "true"),
    ]
    assert cells(driver, "svg#timeline g.mark.checkpoint", "data-kind"), "no checkpoint mark"
    assert driver.find_element(By.ID, "job-state").text == "RUNNING"
    log = driver.find_element(By.ID, "log")
    assert driver.find_element(By.ID, "follow").is_selected()
    # the new instance may not have printed yet when the page was rendered: following fills it in
    browser.wait_until(lambda: "resumed from" in log.text and "ckpt-" in log.text, what="the resume line")
    last_step = browser.wait_until(lambda: _last_step(log.text), what="a step in the log")
    browser.wait_until(
        lambda: (_last_step(log.text) or 0) > last_step + 1, timeout=30, what="the log to grow"
    )
    browser.wait_until(lambda: (_last_step(log.text) or 0) >= 8, timeout=30, what="a few seconds of running")
    driver.refresh()  # the time line is drawn on the server: show the resumed run grown a little
    keep(driver, shots, "job", max_height=1100)


def test_usage_page_plots_gpu_hours_utilisation_and_the_queue_per_viewer(
    scenario: Scenario, driver: Any, shots: Path
) -> None:
    from selenium.webdriver.common.by import By

    sign_in(driver, scenario, "/usage")
    with scenario.server.client() as admin:
        api = {u.name: u for u in admin.usage(by="group")}
    rows = driver.find_elements(By.CSS_SELECTOR, "table.usage tr.account")
    assert [r.get_attribute("data-name") for r in rows] == sorted(api) == ["nlp", "vision"]
    assert api["vision"].gpu_hours > 0 and api["vision"].lost_gpu_hours >= 0
    today = time.strftime("%Y-%m-%d", time.gmtime())
    found = driver.find_elements(By.CSS_SELECTOR, "svg.gpu-hours rect.bar")
    bars = [b.get_attribute("textContent") for b in found]
    assert any(t.startswith(f"vision on {today}:") and t.endswith("GPU-hours") for t in bars), bars
    assert any(t.startswith(f"nlp on {today}:") for t in bars), bars
    assert driver.find_elements(By.CSS_SELECTOR, "svg.utilisation rect.bar")
    points = driver.find_element(By.CSS_SELECTOR, "svg.waiting polyline.line").get_attribute("points")
    assert len(points.split()) == 14 * 24, "an hour a point over two weeks"
    keep(driver, shots, "usage")

    # A plain user's page is their own use only: no other user's or group's row, no group totals.
    bob = httpx.get(f"{scenario.ui}/usage", headers={"Authorization": f"Bearer {TOKENS['bob']}"}, timeout=30)
    assert bob.status_code == 200 and "per user" in bob.text
    assert 'data-name="bob"' in bob.text
    assert not any(f'data-name="{n}"' in bob.text for n in ("alice", "dave", "vision", "nlp"))


def _last_step(text: str) -> int | None:
    steps = [int(line.split()[1]) for line in text.splitlines() if line.startswith("step ")]
    return max(steps) if steps else None


# ---- inside Airflow -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def airflow(scenario: Scenario, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowApiServer]:
    server = AirflowApiServer(tmp_path_factory.mktemp("airflow"))
    try:
        server.start()
        created = httpx.post(
            f"{server.url}/api/v2/connections",
            headers={"Authorization": f"Bearer {server.token()}"},
            json={
                "connection_id": "hai_default",
                "conn_type": "hai",
                "host": scenario.server.url,
                "password": "airflow-token",
                "extra": json.dumps({"user_map": USER_MAP}),
            },
            timeout=30,
        )
        assert created.status_code == 201, created.text
        yield server
    finally:
        server.stop()


def test_airflow_rejects_requests_without_an_airflow_session(airflow: AirflowApiServer, driver: Any) -> None:
    from selenium.webdriver.common.by import By

    assert httpx.get(f"{airflow.url}/hai/queue", timeout=30).status_code == 401
    # the hai token is no Airflow credential
    forged = httpx.get(
        f"{airflow.url}/hai/queue", headers={"Authorization": f"Bearer {TOKENS['admin']}"}, timeout=30
    )
    assert forged.status_code in (401, 403) and "queue" not in forged.text
    driver.delete_all_cookies()
    driver.get(f"{airflow.url}/hai/nodes")
    browser.wait_until(lambda: "/auth/login" in driver.current_url, what="the Airflow login page")
    assert not driver.find_elements(By.CSS_SELECTOR, "section.node")


def test_airflow_renders_the_pages_for_a_logged_in_user(
    scenario: Scenario, airflow: AirflowApiServer, driver: Any, shots: Path
) -> None:
    from selenium.webdriver.common.by import By

    viewer = httpx.get(
        f"{airflow.url}/hai/quota", headers={"Authorization": f"Bearer {airflow.token('viewer')}"}, timeout=30
    )
    # Airflow's viewer is hai's dave: his own group's quota, not what the connection's token sees.
    assert viewer.status_code == 200 and 'data-group="nlp"' in viewer.text
    assert 'data-group="vision"' not in viewer.text
    driver.get(f"{airflow.url}/api/v2/monitor/health")
    driver.add_cookie({"name": "_token", "value": airflow.token("admin"), "path": "/"})
    driver.get(f"{airflow.url}/hai/nodes")
    with scenario.server.client() as admin:
        (node,) = admin.nodes()
    gpus = cells(driver, "section[data-node=node1] g.gpu", "data-gpu")
    jobs = cells(driver, "section[data-node=node1] g.gpu", "data-job")
    assert {int(g): j for g, j in zip(gpus, jobs, strict=True) if j} == {
        g: str(j) for g, j in node.holders.items()
    }
    for page in ("queue", "quota", f"jobs/{scenario.victim}"):
        driver.get(f"{airflow.url}/hai/{page}")
        assert driver.find_element(By.CSS_SELECTOR, "header .brand").text == "HAI GPU training"
        assert not driver.find_elements(By.ID, "error"), driver.find_element(By.ID, "error").text
    link = driver.find_element(By.CSS_SELECTOR, "header nav a[href='/hai/nodes']")
    assert link.text == "Nodes"
    driver.get(f"{airflow.url}/plugin/hai")
    frame = browser.wait_until(
        lambda: driver.find_elements(By.CSS_SELECTOR, "iframe[src$='/hai/queue']"),
        timeout=90,
        what="the GPU training view embedded in the Airflow UI",
    )[0]
    assert browser.wait_until(
        lambda: "GPU training" in driver.find_element(By.TAG_NAME, "body").text, what="the nav entry"
    )
    driver.switch_to.frame(frame)
    browser.wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "header .brand"), what="the framed page")
    driver.switch_to.default_content()
    time.sleep(1)  # let the frame paint before the picture
    keep(driver, shots, "airflow")


def test_hai_job_extra_link_points_at_the_job_page(airflow: AirflowApiServer) -> None:
    ran = airflow.airflow("dags", "test", "hai_job_link")
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    auth = {"Authorization": f"Bearer {airflow.token()}"}
    runs = httpx.get(f"{airflow.url}/api/v2/dags/hai_job_link/dagRuns", headers=auth, timeout=30).json()
    (run,) = runs["dag_runs"]
    for task in ("submit", "submit_and_persist"):
        links = httpx.get(
            f"{airflow.url}/api/v2/dags/hai_job_link/dagRuns/{run['dag_run_id']}/taskInstances/{task}/links",
            headers=auth,
            timeout=30,
        )
        assert links.status_code == 200, links.text
        assert links.json()["extra_links"] == {"HAI job": "/hai/jobs/42"}
    page = httpx.get(f"{airflow.url}/hai/jobs/42", headers=auth, timeout=30)
    assert page.status_code == 404 and "task 42 not found" in page.text
