"""The controller with the real local backend and real processes, stepped by hand, on both stores."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.exc import OperationalError

from hai_airflow.backends.common import procs
from hai_airflow.backends.common.base import BackendUnavailable, Handle, Launch
from hai_airflow.backends.local.backend import LocalBackend
from hai_airflow.server.control import exits as exits_module
from hai_airflow.server.control.controller import Controller
from hai_airflow.server.control.scanner import CHECKPOINT_SCAN_SECONDS
from hai_airflow.server.jobs import transitions
from hai_airflow.server.store.lease import LeaseLost
from hai_airflow.server.store.tables import LeaseRow
from tests.server.conftest import Api
from tests.server.scripts import ELASTIC, SAVES_ON_SIGTERM, TRAIN

A100 = """
[[nodes]]
name = "node2"
gpu_type = "A100"
gpus = 8
cpus = 64
memory_gb = 512

[[resource_packages]]
id = 500
name = "1xA100"
gpu_type = "A100"
gpus = 1
cpus = 4
memory_gb = 32
"""


@pytest.fixture
def run(api: Api) -> Api:
    (api.code / "train.py").write_text(TRAIN)
    (api.code / "elastic.py").write_text(ELASTIC)
    api.with_controller()
    return api


def env_of(api: Api, job_id: int, instance_id: int) -> dict[str, str]:
    model = Path(api.ctx.home) / "jobs" / str(job_id) / "model"
    path = model / f"env-{instance_id}.json"
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    data: dict[str, str] = json.loads(path.read_text())
    return data


def instances(api: Api, job_id: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = api.get(f"/jobs/{job_id}/instances").json()
    return out


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


def test_nonzero_exit_fails_the_job_with_the_code(run: Api) -> None:
    job = run.submit(cmd="python3 train.py 0 3")
    failed = run.until_state(job["id"], "FAILED")
    assert "exit code 3" in failed["reason"]
    assert instances(run, job["id"])[0]["end_reason"] == "failed"


@pytest.mark.parametrize(
    ("pkg", "hinted"), [(500, True), (454, False)], ids=["A100 gets the hint", "V100 does not"]
)
def test_no_kernel_image_on_ampere_says_to_use_cuda_11(api_factory: Any, pkg: int, hinted: bool) -> None:
    api = api_factory(A100)
    api.with_controller()
    error = "RuntimeError: CUDA error: no kernel image is available for execution on the device"
    cmd = f"echo '{error}' >&2; exit 1"
    job = api.submit(cmd=cmd, resource_pkg=pkg)
    failed = api.until_state(job["id"], "FAILED")
    assert ("CUDA 11+" in failed["reason"]) is hinted
    if hinted:
        assert "A100" in failed["reason"]


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


def test_a_job_saving_on_a_sigterm_nobody_here_asked_for_exits_75_and_is_resumed(run: Api) -> None:
    (run.code / "job").mkdir()
    (run.code / "job" / "drain.py").write_text(SAVES_ON_SIGTERM)
    job = run.submit(cmd="cd job && python3 drain.py")
    run.until_state(job["id"], "RUNNING")
    ready = run.ctx.home / "jobs" / str(job["id"]) / "model" / "ready"
    run.until(ready.exists, what="the job to be ready")
    first = instances(run, job["id"])[0]
    os.killpg(json.loads(_handle(run, first["id"]))["workers"][0]["pgid"], signal.SIGTERM)  # a node drain

    done = run.until_state(job["id"], "SUCCEEDED", timeout=20)
    first, second = instances(run, job["id"])
    assert (first["exit_code"], first["end_reason"]) == (75, "suspended")
    assert second["resume"] is True and second["checkpoint"].endswith("drain.pt")
    suspended = [e for e in done["events"] if e["kind"] == "suspended"]
    assert [(e["to_state"], e["reason"]) for e in suspended] == [
        ("SUSPENDED", f"instance {first['id']}: the job saved and asked to be resumed (exit 75)")
    ]
    assert done["preemptions"] == 0


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


def test_exits_seen_together_are_recorded_together_each_with_its_own_outcome(run: Api) -> None:
    go = run.code / "go"
    gate = f"while [ ! -e {go} ]; do sleep 0.02; done; "
    ok = run.submit(cmd=gate + "exit 0", resource_pkg=454)
    failed = run.submit(cmd=gate + "exit 3", resource_pkg=454)
    saved = run.submit(cmd=gate + 'echo w > "$HAI_MODEL_DIR/final.pt"; exit 0', resource_pkg=454)
    jobs = (ok, failed, saved)
    for job in jobs:
        run.until_state(job["id"], "RUNNING")
    handles = [json.loads(_handle(run, instances(run, j["id"])[0]["id"])) for j in jobs]
    go.touch()
    for h in handles:  # all three have ended before the controller looks again
        w = h["workers"][0]
        while procs.is_alive(w["pid"], w["start_time"]):
            time.sleep(0.02)
    run.step()
    assert [run.job(j["id"])["state"] for j in jobs] == ["SUCCEEDED", "FAILED", "SUCCEEDED"]
    assert [instances(run, j["id"])[0]["exit_code"] for j in jobs] == [0, 3, 0]
    assert run.job(ok["id"])["latest_checkpoint"] is None
    assert run.job(saved["id"])["latest_checkpoint"].endswith("final.pt")


def test_a_checkpoint_name_that_is_not_utf8_neither_blocks_others_checkpoints_nor_the_jobs_exit(
    run: Api,
) -> None:
    # A file name the store cannot hold (bytes that are not UTF-8) is never taken for a checkpoint.
    gate = f"while [ ! -e {run.code / 'go'} ]; do sleep 0.02; done; "
    odd = run.submit(
        cmd=f"echo w > \"$HAI_MODEL_DIR/$(printf 'step-\\377.pt')\"; {gate}exit 0", resource_pkg=454
    )
    good = run.submit(cmd=f'echo w > "$HAI_MODEL_DIR/good.pt"; {gate}exit 0', resource_pkg=454)
    for job in (odd, good):
        run.until_state(job["id"], "RUNNING")
    model = run.ctx.home / "jobs" / str(odd["id"]) / "model"
    run.until(lambda: any(n.startswith(b"step-") for n in os.listdir(bytes(model))), what="odd name")
    run.until(lambda: (model.parent.parent / str(good["id"]) / "model" / "good.pt").exists(), what="good")
    assert run.controller is not None
    run.controller.scanner.scan()
    assert run.job(good["id"])["latest_checkpoint"].endswith("good.pt")
    (run.code / "go").touch()
    for job in (odd, good):
        run.until_state(job["id"], "SUCCEEDED")
    assert run.job(odd["id"])["latest_checkpoint"] is None


def test_an_exit_whose_write_failed_for_want_of_the_store_is_written_at_the_next_step(
    run: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    go = run.code / "go"
    job = run.submit(cmd=f"while [ ! -e {go} ]; do sleep 0.02; done; exit 4", resource_pkg=454)
    run.until_state(job["id"], "RUNNING")
    (inst,) = instances(run, job["id"])
    assert run.controller is not None
    controller = run.controller
    real_write = controller.exits.write
    failures = []

    def unreachable() -> Any:  # the store failing as a database does; injected, once
        failures.append(1)
        raise OperationalError("UPDATE leases", {}, Exception("server closed the connection unexpectedly"))

    monkeypatch.setattr(controller.exits, "write", unreachable)
    go.touch()
    w = json.loads(_handle(run, inst["id"]))["workers"][0]
    while procs.is_alive(w["pid"], w["start_time"]):
        time.sleep(0.02)
    with pytest.raises(OperationalError):
        run.step()
    assert failures and run.job(job["id"])["state"] == "RUNNING"
    monkeypatch.setattr(controller.exits, "write", real_write)
    run.step()
    done = run.job(job["id"])
    assert (done["state"], instances(run, job["id"])[0]["exit_code"]) == ("FAILED", 4)


def test_a_slow_checkpoint_scan_waits_longer_for_the_next_so_cycles_are_not_held_up(
    run: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    controller = run.controller
    assert controller is not None
    scans: list[float] = []

    def slow() -> None:  # the model dirs of a thousand running jobs, stood in for by a pause
        scans.append(time.monotonic())
        time.sleep(0.3)

    monkeypatch.setattr(controller.scanner, "scan", slow)
    controller.scanner.last_scan = 0.0
    run.step()
    assert len(scans) == 1
    controller.scanner.last_scan -= CHECKPOINT_SCAN_SECONDS  # the usual interval has passed
    run.step()
    assert len(scans) == 1  # 0.3 s of scanning waits 3 s (SCAN_SHARE 0.1), not 2 s
    controller.scanner.last_scan -= 1.5
    run.step()
    assert len(scans) == 2


def _gated_pair(run: Api, codes: tuple[int, int], last: str = "") -> tuple[list[dict[str, Any]], list[int]]:
    """Two running jobs that, when the test lets them, run `last` and exit (with `codes`), and their
    instance ids."""
    go = run.code / "go"
    jobs = [
        run.submit(cmd=f"while [ ! -e {go} ]; do sleep 0.02; done; {last}exit {code}", resource_pkg=454)
        for code in codes
    ]
    for job in jobs:
        run.until_state(job["id"], "RUNNING")
    insts = [instances(run, j["id"])[0]["id"] for j in jobs]
    workers = [json.loads(_handle(run, i))["workers"][0] for i in insts]
    go.touch()
    for w in workers:  # both have ended before the controller looks again
        while procs.is_alive(w["pid"], w["start_time"]):
            time.sleep(0.02)
    return jobs, insts


def test_an_exit_whose_write_fails_for_a_fault_of_its_own_is_retried_and_the_wave_is_written(
    run: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = transitions.instance_ended
    faulty: set[int] = set()

    def ended(s: Any, job: Any, inst: Any, *rest: Any) -> None:  # a fault in one exit's write, injected
        if inst.id in faulty:
            raise ValueError(f"cannot record instance {inst.id}")
        real(s, job, inst, *rest)

    monkeypatch.setattr(transitions, "instance_ended", ended)
    # Each has a checkpoint: the failing exit is also tried without it, each time it fails.
    (good, bad), (_, bad_inst) = _gated_pair(run, (0, 5), last='echo w > "$HAI_MODEL_DIR/final.pt"; ')
    faulty.add(bad_inst)
    run.step()
    assert run.job(good["id"])["state"] == "SUCCEEDED"  # written in its own transaction
    assert run.job(bad["id"])["state"] == "RUNNING"
    run.step()  # tried again, failing again: still kept
    assert run.job(bad["id"])["state"] == "RUNNING"
    controller = run.controller
    assert controller is not None and controller.exits.failures == {bad_inst: 2}
    controller.reattach()  # as on taking the lease again: tried with the lost ones, counted on
    assert [ex.instance_id for ex in controller.exits.unapplied] == [bad_inst]
    assert controller.exits.failures == {bad_inst: 3}
    logged = [r for r in caplog.records if "without its checkpoint" in r.getMessage()]
    assert len(logged) == 2  # after 0 and 1 failures before, not 2 (then the 10th, the 100th...)
    faulty.clear()
    run.step()
    assert (run.job(bad["id"])["state"], instances(run, bad["id"])[0]["exit_code"]) == ("FAILED", 5)


def test_an_exit_whose_checkpoint_the_store_refuses_is_recorded_without_it(
    run: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*_args: Any) -> None:  # the store refusing what was found in the files; injected
        raise ValueError("cannot record this checkpoint")

    (ok, failed), _ = _gated_pair(run, (0, 3), last='echo w > "$HAI_MODEL_DIR/final.pt"; ')
    monkeypatch.setattr(transitions, "checkpoint_seen", refused)
    run.step()
    assert [run.job(j["id"])["state"] for j in (ok, failed)] == ["SUCCEEDED", "FAILED"]
    assert [run.job(j["id"])["latest_checkpoint"] for j in (ok, failed)] == [None, None]
    assert instances(run, failed["id"])[0]["exit_code"] == 3
    assert run.controller is not None and run.controller.exits.unapplied == []


def test_an_exit_whose_files_cannot_be_read_is_recorded_without_a_hint(
    run: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreadable(*_args: Any, **_kwargs: Any) -> str:  # the log's disk failing; injected
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(exits_module.log_files, "read_tail", unreadable)
    (ok, failed), _ = _gated_pair(run, (0, 3))
    run.step()
    assert [run.job(j["id"])["state"] for j in (ok, failed)] == ["SUCCEEDED", "FAILED"]
    assert instances(run, failed["id"])[0]["exit_code"] == 3


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


def _handle(api: Api, instance_id: int) -> str:
    from hai_airflow.server.store.tables import InstanceRow

    with api.ctx.store.read() as s:
        inst = s.get(InstanceRow, instance_id)
        assert inst is not None and inst.handle
        return inst.handle


def test_only_the_lease_holder_acts_and_a_deposed_one_cannot_write(api_factory: Any) -> None:
    api = api_factory()
    first = api.with_controller()
    first.step()
    assert first.active
    other_api = api_factory()  # same database, another controller identity
    second = Controller(other_api.ctx, LocalBackend({}, other_api.ctx.home))
    other_api.controller = second
    second.step()
    assert not second.active
    assert api.get("/health", user=None).json()["lease_holder"] == first.me

    with api.ctx.store.write() as s:  # the lease runs out while the first controller stalls
        s.execute(update(LeaseRow).values(expires_at=0.0))
    second.step()
    assert second.active
    with pytest.raises(LeaseLost), first.lease.write():
        pass
    api.submit(cmd="true")
    first.active = True  # a stalled controller that still believes it leads
    with pytest.raises(LeaseLost):
        first.step(force=True)
    assert api.job(1)["state"] == "PENDING"  # nothing admitted by the deposed controller


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


def test_after_a_failed_step_the_store_is_read_whole_and_scheduling_goes_on(
    run: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    controller = run.controller
    assert controller is not None
    first = run.submit("alice", cmd="true")
    run.until_state(first["id"], "SUCCEEDED")
    kept = controller.keeper.follower.kept
    assert kept is not None

    def fails() -> list[object]:
        raise RuntimeError("a fault of this step's own")

    monkeypatch.setattr(controller.backend, "poll", fails)
    assert controller.attempt() is False  # logged, not raised
    assert controller.keeper.follower.kept is None  # its rows may be expired: not kept
    monkeypatch.undo()
    second = run.submit("alice", cmd="true")
    run.step()
    assert controller.keeper.follower.kept is not None and controller.keeper.follower.kept is not kept
    run.until_state(second["id"], "SUCCEEDED")


def test_a_backend_that_does_not_answer_is_said_in_one_line_and_waited_out(
    run: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    controller = run.controller
    assert controller is not None
    run.step()
    kept = controller.keeper.follower.kept

    def away() -> list[object]:
        raise BackendUnavailable("the Docker engine on here does not answer")

    monkeypatch.setattr(controller.backend, "poll", away)
    assert controller.attempt() is False
    said = [r for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is None  # one line, no traceback
    assert controller.keeper.follower.kept is kept  # no transaction failed: nothing to read again
    monkeypatch.undo()
    assert controller.attempt() is True
    job = run.submit("alice", cmd="true")
    run.until_state(job["id"], "SUCCEEDED")
