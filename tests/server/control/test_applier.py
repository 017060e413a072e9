"""Applying requests and plans (`server/control/applier.py`), with the real local backend and real
processes, stepped by hand, on both stores: suspensions and the resume after, the elastic job's
notice, cancels, admin holds and rejections."""

from __future__ import annotations

import time

from tests.server.conftest import Api
from tests.server.control.instances import env_of, instances


def test_high_job_suspends_the_longest_running_low_job_which_later_resumes_from_its_checkpoint(
    run: Api,
) -> None:
    older = run.submit(cmd="python3 train.py 60", resource_pkg=456)
    run.until_state(older["id"], "RUNNING")
    time.sleep(0.3)
    newer = run.submit(user="bob", cmd="python3 train.py 60", resource_pkg=456)
    run.until_state(newer["id"], "RUNNING")
    first = instances(run, older["id"])[0]
    env_of(run, older["id"], first["id"])  # it has written its checkpoint
    run.until(lambda: run.job(older["id"])["latest_checkpoint"] is not None, what="checkpoint seen")

    high = run.submit(user="dave", cmd="python3 train.py 1", resource_pkg=456, max_schedule=4)
    t0 = time.monotonic()
    suspended = run.until_state(older["id"], "SUSPENDED", timeout=5)
    assert time.monotonic() - t0 < 2.0
    (gone,) = instances(run, older["id"])
    assert (gone["end_reason"], gone["preempted_by"]) == ("preempted", high["id"])
    assert suspended["preemptions"] == 1
    assert run.job(newer["id"])["state"] == "RUNNING"
    running_high = run.until_state(high["id"], "RUNNING", timeout=5)
    assert running_high["placement"] == first["placement"]
    assert "suspended so high-priority job" in " ".join(e["reason"] for e in suspended["events"])

    resumed = run.until_state(older["id"], "RUNNING", timeout=15)
    second = instances(run, older["id"])[-1]
    assert second["resume"] is True
    assert second["checkpoint"].endswith(f"step-{first['id']}.pt")
    env = env_of(run, older["id"], second["id"])
    assert env["HAI_RESUME"] == "1"
    assert env["HAI_LATEST_CHECKPOINT"].endswith(f"step-{first['id']}.pt")
    assert resumed["instances"] == 2
    assert run.job(high["id"])["state"] == "SUCCEEDED"


def test_elastic_job_is_told_to_save_and_its_final_checkpoint_counts(run: Api) -> None:
    low = run.submit(cmd="exec python3 elastic.py", resource_pkg=457, elastic=True, grace_seconds=10)
    run.until_state(low["id"], "RUNNING")
    ready = run.ctx.home / "jobs" / str(low["id"]) / "model" / "ready"
    run.until(ready.exists, what="the elastic job to be ready")
    run.submit(user="dave", cmd="python3 train.py 30", resource_pkg=457, max_schedule=4)
    suspended = run.until_state(low["id"], "SUSPENDED", timeout=10)
    assert suspended["latest_checkpoint"].endswith("final.pt")
    (inst,) = instances(run, low["id"])
    assert (inst["end_reason"], inst["exit_code"]) == ("preempted", 0)


def test_cancel_stops_a_running_job_and_drops_a_waiting_one(run: Api) -> None:
    running = run.submit(cmd="python3 train.py 60", resource_pkg=457)
    run.until_state(running["id"], "RUNNING")
    waiting = run.submit(cmd="python3 train.py 60", resource_pkg=457)
    run.step()
    assert run.job(waiting["id"])["state"] == "PENDING"
    run.post(f"/jobs/{waiting['id']}/cancel", "alice")
    run.post(f"/jobs/{running['id']}/cancel", "alice")
    cancelled = run.until_state(running["id"], "CANCELLED")
    assert instances(run, running["id"])[0]["end_reason"] == "cancelled"
    assert cancelled["reason"].endswith("cancelled by alice")
    assert run.until_state(waiting["id"], "CANCELLED")["instances"] == 0
    again = run.post(f"/jobs/{running['id']}/cancel", "alice")
    assert again.status_code == 409


def test_admin_hold_stops_the_job_until_resumed(run: Api) -> None:
    job = run.submit(cmd="python3 train.py 60")
    run.until_state(job["id"], "RUNNING")
    run.post(f"/jobs/{job['id']}/suspend", "carol")
    held = run.until_state(job["id"], "SUSPENDED")
    assert instances(run, job["id"])[0]["end_reason"] == "suspended"
    for _ in range(3):
        run.step()
    assert run.job(job["id"])["state"] == "SUSPENDED"
    assert "carol" in held["reason"]
    run.post(f"/jobs/{job['id']}/resume", "carol")
    run.until_state(job["id"], "RUNNING")
    assert env_of(run, job["id"], instances(run, job["id"])[-1]["id"])["HAI_RESUME"] == "1"


def test_a_job_that_can_never_fit_is_rejected(run: Api) -> None:
    job = run.submit(mode="distributed", workers=2, worker_resource_pkg=457, cmd="true")
    failed = run.until_state(job["id"], "FAILED")
    assert failed["reason"].startswith("cannot run on this cluster")
