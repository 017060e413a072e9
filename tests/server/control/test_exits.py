"""Recording exits (`server/control/exits.py`), with the real local backend and real processes, stepped
by hand, on both stores: the job's next state and its failure hint, exits seen together, and the
retry ladder when a write fails."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from hai_airflow.backends.common import procs
from hai_airflow.server.control import exits as exits_module
from hai_airflow.server.jobs import transitions
from tests.server.conftest import Api
from tests.server.control.instances import _handle, instances
from tests.server.scripts import SAVES_ON_SIGTERM

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
