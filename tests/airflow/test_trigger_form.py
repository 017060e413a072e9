"""The Airflow UI's Trigger form on `hai_submit_training`, in headless Chromium, as the person signed in.

The real services (api-server, scheduler, dag-processor, triggerer) and a live `hai serve`; Airflow's
connection holds hai's service identity, which acts for whoever triggers. Each case fills only what
it needs, as a person would, and checks that Trigger is enabled, the run ends as it should and the hai
job is the signed-in person's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.airflow.helpers import HAI_CONFIG, INCLUDE
from tests.airflow.services import PASSWORD, AirflowServices, poll
from tests.airflow.trigger_form import TriggerForm, renders_cjk, screenshot_on_failure, sign_in
from tests.dashboard import browser
from tests.support.gitrepo import bare_origin
from tests.support.live_server import LiveServer, start_server

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(browser.missing() is not None, reason=str(browser.missing())),
    pytest.mark.timeout(900),
]

DAG_ID = "hai_submit_training"
# Over 10 s, so no deferral ends inside the window where the LocalExecutor can wrongly fail a task
# resuming from a short deferral (apache/airflow #71580).
TRAIN = "python3 train.py --steps 12 --ckpt-every 6 --step-sleep 1"


class Stack:
    def __init__(self, hai: LiveServer, airflow: AirflowServices, driver: Any, origin: Path) -> None:
        self.hai, self.airflow, self.driver, self.origin = hai, airflow, driver, origin
        self.api = airflow.api("admin")

    def runs(self) -> dict[str, dict[str, Any]]:
        body = self.api.get(f"/dags/{DAG_ID}/dagRuns", params={"limit": 100}).json()
        return {r["dag_run_id"]: r for r in body["dag_runs"]}

    def open_form(self, user: str) -> TriggerForm:
        sign_in(self.driver, self.airflow.url, user, PASSWORD)
        return TriggerForm(self.driver, self.airflow.url, DAG_ID)

    def trigger(self, form: TriggerForm) -> str:
        """Press Trigger; the id of the run it made."""
        before = set(self.runs())
        form.submit()
        new = poll(lambda: set(self.runs()) - before, 60, "the triggered run", self.airflow.logs)
        (run_id,) = new
        return str(run_id)

    def finished(self, run_id: str, timeout: float = 420) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            run = self.api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}").json()
            return run if run["state"] in ("success", "failed") else None

        run: dict[str, Any] = poll(done, timeout, f"run {run_id} to finish", self.airflow.logs)
        return run

    def task_log(self, run_id: str, task_id: str) -> str:
        return self.api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}/logs/1").text

    def job_of(self, token: str, task_name: str) -> Any:
        with self.hai.client(token) as client:
            (job,) = [j for j in client.jobs() if j.task_name == task_name]
            return client.job(job.id)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("trigger-form")
    origin = bare_origin(
        root,
        {"main": {"README": "\n"}, "feature": {"train.sh": 'echo "feature branch in $(pwd)"; sleep 12\n'}},
    )
    with start_server(root / "hai", HAI_CONFIG) as hai, browser.chromium() as driver:
        driver.set_window_size(1280, 2400)  # the whole dialog in one picture
        airflow = AirflowServices(root / "airflow", hai)
        try:
            airflow.start()
            stack = Stack(hai, airflow, driver, origin)
            poll(
                lambda: stack.api.get(f"/dags/{DAG_ID}").status_code == 200,
                240,
                "the DAG to be parsed",
                airflow.logs,
            )
            yield stack
        finally:
            airflow.stop()


def test_the_form_opens_ready_to_trigger_and_a_nas_job_needs_three_fields(stack: Stack) -> None:
    with screenshot_on_failure(stack.driver, "nas-standalone"):
        form = stack.open_form("alice")
        assert form.can_submit(), f"Trigger is disabled as the form opens: {form.errors()}"
        assert form.errors() == []
        assert renders_cjk(stack.driver), "no CJK font: the Chinese labels show as boxes; run .ci/chromium.sh"
        form.type("task_name", "web nas job")
        form.type("code_path", str(INCLUDE))
        form.type("cmd", TRAIN)
        run_id = stack.trigger(form)
    run = stack.finished(run_id)
    assert run["state"] == "success", stack.task_log(run_id, "submit_standalone")
    assert run["triggering_user_name"] == "alice"
    job = stack.job_of("alice-token", "web nas job")
    assert (job.user, job.submitted_via, job.mode, job.gpus, job.state) == (
        "alice",
        "airflow",
        "standalone",
        1,
        "SUCCEEDED",
    )
    assert job.spec["git_branch"] is None and job.spec["gpu_type"] is None
    log = stack.task_log(run_id, "submit_standalone")
    assert f"/hai/jobs/{job.id}" in log.split("RUNNING")[0], "the job's page is not linked before it runs"


def test_a_git_job_with_a_branch(stack: Stack) -> None:
    with screenshot_on_failure(stack.driver, "git-branch"):
        form = stack.open_form("bob")
        form.type("task_name", "web git job")
        form.choose("code_src", "Git")
        form.type("code_path", str(stack.origin))
        form.type("git_branch", "feature")
        form.type("cmd", "sh train.sh")
        form.choose("gpu_type", "V100")
        run_id = stack.trigger(form)
    run = stack.finished(run_id)
    assert run["state"] == "success", stack.task_log(run_id, "submit_standalone")
    job = stack.job_of("bob-token", "web git job")
    assert (job.user, job.spec["code_src"], job.spec["git_branch"], job.spec["gpu_type"]) == (
        "bob",
        "git",
        "feature",
        "V100",
    )
    assert "feature branch in" in stack.task_log(run_id, "submit_standalone")


def test_a_distributed_job_of_two_workers(stack: Stack) -> None:
    with screenshot_on_failure(stack.driver, "distributed"):
        form = stack.open_form("alice")
        form.type("task_name", "web distributed job")
        form.choose("mode", "Distributed")
        form.type("code_path", str(INCLUDE))
        form.type("cmd", "sleep 12")
        form.open_section("分布式训练 Distributed (multi-machine)")
        assert form.value("workers") == "2"
        form.type("min_workers", "1")
        form.choose("worker_resource_pkg", "1xV100")
        run_id = stack.trigger(form)
    run = stack.finished(run_id)
    assert run["state"] == "success", stack.task_log(run_id, "submit_distributed")
    job = stack.job_of("alice-token", "web distributed job")
    shape = (job.user, job.mode, job.workers, job.min_workers, job.size, job.gpus, job.state)
    assert shape == ("alice", "distributed", 2, 1, 2, 2, "SUCCEEDED")
    assert job.spec["elastic"] is True


def test_a_cpu_job(stack: Stack) -> None:
    with screenshot_on_failure(stack.driver, "cpu"):
        form = stack.open_form("bob")
        form.type("task_name", "web cpu job")
        form.choose("mode", "CPU")
        form.type("code_path", str(INCLUDE))
        form.type("cmd", "sleep 12")
        form.open_section("CPU任务 CPU job")
        form.type("cpus", "2")
        run_id = stack.trigger(form)
    run = stack.finished(run_id)
    assert run["state"] == "success", stack.task_log(run_id, "submit_cpu")
    job = stack.job_of("bob-token", "web cpu job")
    assert (job.user, job.mode, job.gpus, job.spec["cpus"], job.state) == ("bob", "cpu", 0, 2, "SUCCEEDED")


def test_high_priority_beyond_the_persons_quota_is_refused_in_the_task_log(stack: Stack) -> None:
    with stack.hai.client() as admin:
        admin.set_user_quota("bob", 0)
    with screenshot_on_failure(stack.driver, "over-quota"):
        form = stack.open_form("bob")
        form.type("task_name", "web too high")
        form.type("code_path", str(INCLUDE))
        form.choose("max_schedule", "4 h")
        run_id = stack.trigger(form)
    run = stack.finished(run_id)
    assert run["state"] == "failed"
    log = stack.task_log(run_id, "submit_standalone")
    assert "acting for hai user bob (group vision) via airflow" in log
    assert "high-priority quota does not cover 1 GPUs" in log
    with stack.hai.client("bob-token") as bob:
        assert [j.task_name for j in bob.jobs() if j.task_name == "web too high"] == []


def test_the_airflow_api_refuses_a_request_without_a_session(stack: Stack) -> None:
    created = httpx.post(f"{stack.airflow.url}/api/v2/dags/{DAG_ID}/dagRuns", json={"conf": {}}, timeout=30)
    assert created.status_code == 401
