"""Jobs that wait for others (`after`, `after_any`), with the real local backend, on both stores:
held from the planner until what they wait for has ended, then released or cancelled with the reason;
refused at submission when they name a job the submitter may not see or one that can never succeed."""

from __future__ import annotations

from pathlib import Path

import pytest

from hai_airflow.server.jobs.dependencies import Waits, verdict
from hai_airflow.spec import JobState
from tests.server.conftest import Api
from tests.server.scripts import TRAIN


@pytest.fixture
def run(api: Api) -> Api:
    (api.code / "train.py").write_text(TRAIN)
    api.with_controller()
    return api


def events(api: Api, job_id: int) -> list[tuple[str, str | None]]:
    return [(e["kind"], e["to_state"]) for e in api.get(f"/jobs/{job_id}").json()["events"]]


def test_a_job_after_another_waits_for_its_success_then_runs(run: Api, tmp_path: Path) -> None:
    gate = tmp_path / "gate"  # the first job runs until the test has looked (at most 60 s)
    first = run.submit(cmd=f"for i in $(seq 1200); do [ -e {gate} ] && exit 0; sleep 0.05; done; exit 1")
    second = run.submit(cmd="true", after=[first["id"]])
    assert second["state"] == "PENDING"
    assert second["reason"] == f"waiting for task {first['id']} to succeed (--after)"
    run.until_state(first["id"], "RUNNING")
    for _ in range(3):
        run.step()
    assert run.job(second["id"])["state"] == "PENDING", "its dependency runs: it waits"
    queue = {e["job"]["id"]: e["reason"] for e in run.get("/queue").json()}
    assert queue[second["id"]] == second["reason"]
    gate.touch()
    run.until_state(first["id"], "SUCCEEDED")
    done = run.until_state(second["id"], "SUCCEEDED")
    assert ("released", "PENDING") in events(run, second["id"]) and done["instances"] == 1


def test_a_job_after_a_failed_one_is_cancelled_with_the_reason_and_after_any_runs(run: Api) -> None:
    failing = run.submit(cmd="exit 3")
    ok = run.submit(cmd="true", after=[failing["id"]])
    anyway = run.submit(cmd="true", after_any=[failing["id"]])
    cancelled = run.until_state(ok["id"], "CANCELLED")
    assert cancelled["reason"] == f"task {failing['id']} ended FAILED, so its --after can never be met"
    assert cancelled["instances"] == 0
    assert run.until_state(anyway["id"], "SUCCEEDED")["instances"] == 1


def test_a_chain_runs_in_order(run: Api) -> None:
    a = run.submit(cmd="python3 train.py 0.5")
    b = run.submit(cmd="python3 train.py 0.5", after=[a["id"]])
    c = run.submit(cmd="true", after=[a["id"], b["id"]])
    run.until_state(c["id"], "SUCCEEDED", timeout=30)
    ids = (a["id"], b["id"], c["id"])
    started = {j: run.get(f"/jobs/{j}/instances").json()[0]["started_at"] for j in ids}
    ended_a = run.job(a["id"])["ended_at"]
    assert started[a["id"]] < ended_a <= started[b["id"]] < started[c["id"]]


def test_a_waiting_job_can_be_cancelled(run: Api) -> None:
    first = run.submit(cmd="python3 train.py 30")
    second = run.submit(cmd="true", after=[first["id"]])
    run.post(f"/jobs/{second['id']}/cancel", "alice")
    assert run.until_state(second["id"], "CANCELLED")["instances"] == 0


@pytest.mark.parametrize("field", ["after", "after_any"])
def test_a_dependency_the_submitter_may_not_see_is_not_found(api: Api, field: str) -> None:
    dave = api.submit(user="dave", cmd="true")
    r = api.post("/jobs", "alice", json={"spec": api.spec(cmd="true", **{field: [dave["id"]]})})
    assert r.status_code == 422 and f"{field}: task {dave['id']} not found" in r.text
    r = api.post("/jobs", "alice", json={"spec": api.spec(cmd="true", **{field: [99999]})})
    assert r.status_code == 422 and f"{field}: task 99999 not found" in r.text
    carol = api.post("/jobs", "carol", json={"spec": api.spec(cmd="true", after=[])})
    assert carol.status_code == 201


def test_after_a_job_that_already_failed_is_refused_but_after_any_is_not(run: Api) -> None:
    failed = run.submit(cmd="exit 1")
    run.until_state(failed["id"], "FAILED")
    r = run.post("/jobs", "alice", json={"spec": run.spec(cmd="true", after=[failed["id"]])})
    assert r.status_code == 422 and "already ended FAILED; this task could never start" in r.text
    assert "--after-any" in r.json()["fix"]
    anyway = run.submit(cmd="true", after_any=[failed["id"]])
    assert run.until_state(anyway["id"], "SUCCEEDED")["instances"] == 1


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ({1: JobState.RUNNING, 2: JobState.SUCCEEDED, 3: JobState.FAILED}, None),
        ({1: JobState.SUCCEEDED, 2: JobState.SUCCEEDED, 3: JobState.FAILED}, True),
        ({1: JobState.SUCCEEDED, 2: JobState.TIMEOUT, 3: JobState.SUCCEEDED}, False),
        ({1: JobState.CANCELLED, 2: JobState.SUCCEEDED, 3: JobState.PENDING}, None),
    ],
)
def test_the_verdict(states: dict[int, JobState], expected: bool | None) -> None:
    decided = verdict(Waits(ok=(1, 2), any=(3,)), states)
    assert (decided.release if decided else None) is expected
