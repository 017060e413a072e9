"""Time limits with the real local backend and real processes: at the limit a running job gets the
notice and its grace and ends TIMEOUT; suspended time does not count; on both stores."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hai_airflow.server.control.mirror import read_all
from tests.server.conftest import Api
from tests.server.scripts import SAVES_ON_SIGTERM, TRAIN


@pytest.fixture
def run(api: Api) -> Api:
    (api.code / "train.py").write_text(TRAIN)
    (api.code / "saves.py").write_text(SAVES_ON_SIGTERM)
    api.with_controller()
    return api


def model_dir(api: Api, job_id: int) -> Path:
    return Path(api.ctx.home) / "jobs" / str(job_id) / "model"


def test_a_job_past_its_limit_is_stopped_and_ends_timeout(run: Api) -> None:
    job = run.submit(cmd="python3 train.py 60", time_limit_seconds=1)
    started = time.monotonic()
    done = run.until_state(job["id"], "TIMEOUT")
    assert 1 <= time.monotonic() - started < 10
    (inst,) = run.get(f"/jobs/{job['id']}/instances").json()
    assert (inst["end_reason"], inst["exit_code"]) == ("timeout", -9), "no grace: killed at once"
    assert done["reason"].startswith("reached its time limit of 1s")
    assert f"hai requeue {job['id']}" in done["reason"]
    assert done["ended_at"] is not None and done["runtime_seconds"] >= 1
    kinds = [(e["kind"], e["to_state"]) for e in run.get(f"/jobs/{job['id']}").json()["events"]]
    assert ("stopping", "RUNNING") in kinds and kinds[-1] == ("timeout", "TIMEOUT")


def test_an_elastic_job_at_its_limit_saves_in_its_grace_before_it_ends(run: Api) -> None:
    job = run.submit(cmd="python3 saves.py", elastic=True, grace_seconds=20, time_limit_seconds=2)
    done = run.until_state(job["id"], "TIMEOUT", timeout=20)
    (inst,) = run.get(f"/jobs/{job['id']}/instances").json()
    assert (inst["end_reason"], inst["exit_code"]) == ("timeout", 75)
    assert (model_dir(run, job["id"]) / "drain.pt").read_text() == "weights"
    assert done["reason"].endswith(f"`hai requeue {job['id']}` runs it again from its checkpoint")


def test_a_job_that_completes_within_its_grace_succeeded(run: Api) -> None:
    (run.code / "finishes.py").write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
        "time.sleep(60)\n"
    )
    job = run.submit(cmd="python3 finishes.py", grace_seconds=20, elastic=True, time_limit_seconds=1)
    assert run.until_state(job["id"], "SUCCEEDED", "TIMEOUT")["state"] == "SUCCEEDED"


def test_suspended_time_does_not_count_and_a_resumed_job_keeps_its_runtime(run: Api) -> None:
    job = run.submit(cmd="python3 train.py 60", time_limit_seconds=4)
    run.until_state(job["id"], "RUNNING")
    time.sleep(1)
    run.post(f"/jobs/{job['id']}/suspend", "carol")
    suspended = run.until_state(job["id"], "SUSPENDED")
    ran = suspended["runtime_seconds"]
    assert 1 <= ran < 4
    time.sleep(4 - ran + 0.5)  # longer than what is left of the limit, but suspended
    for _ in range(2):
        run.step()
    assert run.job(job["id"])["state"] == "SUSPENDED"
    run.post(f"/jobs/{job['id']}/resume", "carol")
    run.until_state(job["id"], "RUNNING")
    done = run.until_state(job["id"], "TIMEOUT")
    assert done["runtime_seconds"] >= 4 and done["instances"] == 2


def test_a_suspended_job_that_used_its_time_while_suspending_ends_timeout_where_it_waits(run: Api) -> None:
    job = run.submit(cmd="python3 saves.py", elastic=True, grace_seconds=20, time_limit_seconds=2)
    run.until(lambda: run.job(job["id"])["runtime_seconds"] >= 1.2, what="the job ran 1.2 s")
    run.post(f"/jobs/{job['id']}/suspend", "carol")  # its save takes 1 s: past the limit by then
    done = run.until_state(job["id"], "TIMEOUT")
    last = run.get(f"/jobs/{job['id']}").json()["events"][-1]
    assert (last["kind"], last["from_state"], last["to_state"]) == ("timeout", "SUSPENDED", "TIMEOUT")
    assert done["instances"] == 1, "never started again"
    assert done["runtime_seconds"] >= 2


def test_the_limit_is_kept_as_a_column_the_controller_reads_without_the_spec(run: Api) -> None:
    limited = run.submit(cmd="true", time_limit_seconds=3600)
    free = run.submit(cmd="true")
    with run.ctx.store.read() as s:
        kept = read_all(s, run.ctx.config.server.policy)
    assert kept.limited == {limited["id"]} and free["id"] in kept.jobs
    assert kept.jobs[limited["id"]].time_limit_seconds == 3600


@pytest.mark.parametrize("bad", [0, -5, 400 * 24 * 3600, "4h"])
def test_a_bad_time_limit_is_refused_naming_the_field(api: Api, bad: object) -> None:
    r = api.post("/jobs", "alice", json={"spec": api.spec(cmd="true", time_limit_seconds=bad)})
    assert r.status_code == 422, r.text
    assert "time_limit_seconds" in r.text
