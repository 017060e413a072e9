"""The controller as a whole, with the real local backend and real processes, stepped by hand, on both
stores: a job's way from submit to exit, settled cycles, the nodes and long-polls it serves, and a
restart's reattach."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import update

from hai_airflow.backends.common import procs
from hai_airflow.backends.common.base import Handle, Launch
from hai_airflow.backends.local.backend import LocalBackend
from hai_airflow.server.control.controller import Controller
from hai_airflow.server.store.tables import LeaseRow
from tests.server.conftest import Api
from tests.server.control.instances import _handle, env_of, instances


def test_a_job_runs_to_success_seeing_the_platform_environment(run: Api) -> None:
    job = run.submit(cmd="python3 train.py 0.2", project_storage=[10111])
    done = run.until_state(job["id"], "SUCCEEDED")
    (inst,) = instances(run, job["id"])
    assert (inst["exit_code"], inst["end_reason"], inst["resume"]) == (0, "completed", False)
    env = env_of(run, job["id"], inst["id"])
    assert env["HAI_JOB_ID"] == str(job["id"]) and env["HAI_INSTANCE_ID"] == str(inst["id"])
    assert env["HAI_RESUME"] == "0" and "HAI_LATEST_CHECKPOINT" not in env
    assert (
        env["HAI_MODEL_DIR"]
        == env["HAI_CHECKPOINT_DIR"]
        == str(run.ctx.home / "jobs" / str(job["id"]) / "model")
    )
    assert env["HAI_PREEMPT_NOTICE"].startswith(str(run.ctx.home / "jobs" / str(job["id"]) / "instances"))
    assert env["HAI_PROJECT_STORAGE_10111"] == str(run.ctx.home / "storage" / "10111")
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert done["latest_checkpoint"].endswith(f"step-{inst['id']}.pt")
    kinds = [e["kind"] for e in done["events"]]
    assert kinds[:3] == ["submitted", "admitted", "started"] and kinds[-1] == "succeeded"
    log = run.get(f"/instances/{inst['id']}/log", params={"tail": 1})
    assert log.text.strip() == "done"
    assert "training run" in run.get(f"/instances/{inst['id']}/log", params={"tail": 0}).text
    followed = run.get(f"/instances/{inst['id']}/log", params={"tail": 0, "follow": True})
    assert followed.text.endswith("done\n")


def test_a_settled_cluster_is_not_planned_again_until_something_changes(
    run: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a plan that only made jobs wait, cycles skip planning; the next event plans at once."""
    # The periodic replan is not this test's point: on a loaded machine its steps may span it.
    monkeypatch.setattr("hai_airflow.scheduling.settled.REPLAN_SECONDS", 3600.0)
    settled = "hai_planner_settled_cycles_total"
    running = run.submit(cmd="python3 train.py 60", resource_pkg=457)
    run.until_state(running["id"], "RUNNING")
    waiting = run.submit(cmd="true", resource_pkg=454)
    run.step()
    assert run.job(waiting["id"])["state"] == "PENDING"
    before = run.ctx.metrics.registry.get_sample_value(settled) or 0.0
    for _ in range(3):
        run.step()
    assert run.ctx.metrics.registry.get_sample_value(settled) == before + 3, "nothing changed: not planned"
    assert run.job(waiting["id"])["state"] == "PENDING"
    later = run.submit(cmd="true", resource_pkg=454)  # low, and no GPU is free: it waits anyway
    run.step()
    assert run.ctx.metrics.registry.get_sample_value(settled) == before + 4, "it waits anyway: not planned"
    assert run.job(later["id"])["reason"] == "waiting for the scheduler", "its reason comes with a plan"
    run.post(f"/jobs/{running['id']}/cancel", "alice")  # an event: the GPUs come free
    run.until_state(waiting["id"], "SUCCEEDED")
    run.until_state(later["id"], "SUCCEEDED")


def test_nodes_show_gpu_holders_while_running(run: Api) -> None:
    job = run.submit(cmd="python3 train.py 60", resource_pkg=455)
    run.until_state(job["id"], "RUNNING")
    (node,) = run.get("/nodes").json()
    assert node["holders"] == {"0": job["id"], "1": job["id"]}
    assert node["free_gpus"] == [2, 3, 4, 5, 6, 7]
    packages = {p["id"]: p["startable_now"] for p in run.get("/resource-packages").json()}
    assert packages[457] == 0 and packages[456] == 1


def test_wait_returns_on_change_or_timeout(run: Api) -> None:
    job = run.submit(cmd="python3 train.py 60")
    t0 = time.monotonic()
    same = run.get(f"/jobs/{job['id']}/wait", params={"since_state": "PENDING", "timeout": 0.5}).json()
    assert same["state"] == "PENDING" and time.monotonic() - t0 >= 0.45
    assert run.controller is not None
    run.controller.start()
    t0 = time.monotonic()
    changed = run.get(f"/jobs/{job['id']}/wait", params={"since_state": "PENDING", "timeout": 10}).json()
    assert changed["state"] in ("STARTING", "RUNNING") and time.monotonic() - t0 < 3
    body = run.get(f"/jobs/{job['id']}/wait", params={"since_state": "NAPPING"}).json()
    assert body["field"] == "since_state"


def test_restart_reattaches_live_instances_and_requeues_lost_ones(run: Api) -> None:
    alive = run.submit(cmd="python3 train.py 60", resource_pkg=456)
    doomed = run.submit(user="bob", cmd="python3 train.py 60", resource_pkg=456)
    run.until_state(alive["id"], "RUNNING")
    run.until_state(doomed["id"], "RUNNING")
    env_of(run, doomed["id"], instances(run, doomed["id"])[0]["id"])
    run.until(lambda: run.job(doomed["id"])["latest_checkpoint"] is not None, what="checkpoint seen")
    assert run.controller is not None
    run.controller.stop()  # like a server exit: instances keep running
    handle = json.loads(_handle(run, instances(run, doomed["id"])[0]["id"]))
    os.killpg(handle["workers"][0]["pgid"], signal.SIGKILL)  # dies while nobody watches
    time.sleep(0.2)

    run.with_controller()
    run.step()
    assert run.job(alive["id"])["state"] == "RUNNING"
    assert len(instances(run, alive["id"])) == 1
    lost = instances(run, doomed["id"])[0]
    assert lost["end_reason"] == "lost"
    back = run.until_state(doomed["id"], "RUNNING")
    second = instances(run, doomed["id"])[-1]
    assert second["resume"] is True and back["instances"] == 2
    assert env_of(run, doomed["id"], second["id"])["HAI_LATEST_CHECKPOINT"].endswith(f"step-{lost['id']}.pt")
    # the adopted instance is still under control: cancel reaches it
    run.post(f"/jobs/{alive['id']}/cancel", "alice")
    run.until_state(alive["id"], "CANCELLED")


class ServerKilled(BaseException):
    """The server process dies: nothing after this point of the controller runs."""


class DiesAfterStart(LocalBackend):
    """Starts the instance for real, then the server dies before the handle is saved."""

    def __init__(self, home: Path) -> None:
        super().__init__({"watch_interval_seconds": 0.05}, home)
        self.started: list[Handle] = []

    def start(self, launch: Launch) -> Handle:
        self.started.append(super().start(launch))
        raise ServerKilled


def test_an_instance_started_but_never_recorded_is_killed_before_its_job_is_requeued(run: Api) -> None:
    dying = DiesAfterStart(run.ctx.home)
    run.controller = Controller(run.ctx, dying)
    job = run.submit(cmd="python3 train.py 60", resource_pkg=456)
    with pytest.raises(ServerKilled):
        run.step()
    (handle,) = dying.started
    first = instances(run, job["id"])[0]
    env_of(run, job["id"], first["id"])  # the training process runs
    dying.close()
    pgid = int(handle.data["workers"][0]["pgid"])
    assert procs.group_is_alive(pgid)
    with run.ctx.store.write() as s:  # a killed server never hands its lease back
        s.execute(update(LeaseRow).values(expires_at=0.0))

    run.with_controller()
    run.step()
    assert not procs.group_is_alive(pgid), "the unrecorded instance must not run beside the new one"
    assert instances(run, job["id"])[0]["end_reason"] == "lost"
    back = run.until_state(job["id"], "RUNNING")
    assert back["instances"] == 2
