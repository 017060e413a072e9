"""HaiJobSensor and HaiCheckpointSensor in `dag.test()` runs, deferred and poking."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hai_airflow.spec import CpuJobSpec, JobView
from tests.airflow.helpers import DAG_TEST_USER, SERVICE_TOKEN, connection_json, load_dag, task_states, xcom
from tests.support.live_server import LiveServer


def submit(server: LiveServer, cmd: str) -> JobView:
    with server.client() as client:
        return client.submit(CpuJobSpec(task_name="watched", code_path="/tmp", cmd=cmd))


def test_job_sensor_deferred_until_running_and_never_cancels(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn()
    job = submit(server, "sleep 30")
    run = load_dag("hai_job_sensor_running").test(run_conf={"job_id": job.id})

    assert task_states(run) == {"wait": "success"}
    assert xcom(run, "wait")["state"] == "RUNNING"
    with server.client() as client:
        assert client.job(job.id).state == "RUNNING"


@pytest.mark.parametrize(("cmd", "state"), [("sleep 1", "success"), ("exit 2", "failed")])
def test_job_sensor_poking_for_success(hai_conn: Callable[..., LiveServer], cmd: str, state: str) -> None:
    job = submit(hai_conn(), cmd)
    run = load_dag("hai_job_sensor_poke").test(run_conf={"job_id": job.id})
    assert task_states(run) == {"wait": state}


def test_checkpoint_sensor_on_a_path(tmp_path: Path) -> None:
    (tmp_path / "checkpoint-00000005.pt").write_bytes(b"seen already")

    def save_later() -> None:
        time.sleep(2)
        temp = tmp_path / ".checkpoint-00000010.tmp-7"
        temp.write_bytes(b"new")
        os.replace(temp, tmp_path / "checkpoint-00000010.pt")

    saver = threading.Thread(target=save_later)
    saver.start()
    run = load_dag("hai_checkpoint_sensor_path").test(run_conf={"path": str(tmp_path), "after_step": 5})
    saver.join()

    assert task_states(run) == {"wait": "success"}
    found = xcom(run, "wait")
    assert (found["step"], found["checkpoint"]) == (10, str(tmp_path / "checkpoint-00000010.pt"))


def test_checkpoint_sensor_skips_when_the_job_ends_without_one(hai_conn: Callable[..., LiveServer]) -> None:
    job = submit(hai_conn(), "sleep 2")
    run = load_dag("hai_checkpoint_sensor_job").test(run_conf={"job_id": job.id, "after_step": 0})
    assert task_states(run) == {"wait": "skipped"}


def test_job_sensor_through_a_service_sees_the_persons_job_only(
    hai_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through Airflow's service identity the sensor acts for the person behind the run, as operators do."""
    with hai_server.client("alice-token") as alice, hai_server.client("dave-token") as dave:
        hers = alice.submit(CpuJobSpec(task_name="hers", code_path="/tmp", cmd="true"))
        his = dave.submit(CpuJobSpec(task_name="his", code_path="/tmp", cmd="true"))
    monkeypatch.setenv(
        "AIRFLOW_CONN_HAI_DEFAULT", connection_json(hai_server, SERVICE_TOKEN, {DAG_TEST_USER: "alice"})
    )
    dag = load_dag("hai_job_sensor_poke")
    assert task_states(dag.test(run_conf={"job_id": hers.id})) == {"wait": "success"}
    # dave is not in the service's acts_for: the sensor fails rather than look as the service itself.
    monkeypatch.setenv(
        "AIRFLOW_CONN_HAI_DEFAULT", connection_json(hai_server, SERVICE_TOKEN, {DAG_TEST_USER: "dave"})
    )
    assert task_states(dag.test(run_conf={"job_id": his.id})) == {"wait": "failed"}
