"""`hai_submit_training`'s form: fields from the hai server at parse time, a fallback when it is down."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hai_airflow.spec import StandaloneJobSpec
from tests.airflow.helpers import HAI_CONFIG, INCLUDE, connection_json, load_dag, task_states
from tests.support.live_server import LiveServer, free_port, start_server

DAG_ID = "hai_submit_training"
NEW_FIELDS = {"max_schedule", "model_dir", "project_storage", "shm", "git_branch"}


def form_params(dag_id: str = DAG_ID) -> dict[str, dict[str, object]]:
    params = load_dag(dag_id).params
    return {name: params.get_param(name).schema for name in params}


def test_the_form_has_the_platforms_fields(hai_conn: Callable[..., LiveServer]) -> None:
    hai_conn()
    schema = form_params()
    assert set(schema) >= NEW_FIELDS | {"task_name", "mode", "resource_pkg", "gpu_type", "code_src", "cmd"}
    assert schema["max_schedule"]["enum"] == [0, 4, 6, 8, 24, 48]
    assert schema["shm"]["type"] == ["null", "integer"]


def test_the_package_dropdown_comes_from_the_server(hai_conn: Callable[..., LiveServer]) -> None:
    hai_conn()
    params = load_dag(DAG_ID).params
    package = params.get_param("resource_pkg")
    worker = params.get_param("worker_resource_pkg")

    # the test server's GPU packages (the CPU package 100 is not offered for training)
    assert package.schema["enum"] == [454, 455, 456, 457]
    assert package.schema["values_display"]["455"].startswith("2xV100: 2 x V100")
    assert (package.value, worker.value) == (454, 457)
    # "the package's" type is a real choice: None, which the browser counts as filled in
    assert params.get_param("gpu_type").schema["enum"] == [None, "V100"]
    assert params.get_param("gpu_type").value is None


REQUIRED = {"task_name", "mode", "max_schedule", "image", "resource_pkg", "code_src", "code_path", "cmd"}
"""What every job needs; the worker package is required too, but has a default."""


@pytest.mark.parametrize("server_up", [pytest.param(True, id="server up"), pytest.param(False, id="down")])
def test_every_optional_field_may_stay_empty_in_the_browser(
    server_up: bool, hai_conn: Callable[..., LiveServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airflow's form requires each field whose type does not allow null, and an empty one blocks
    Trigger: so each such field must have a valid default, and every other field allows null."""
    if server_up:
        hai_conn()
    else:
        down = {"conn_type": "hai", "host": f"http://127.0.0.1:{free_port()}", "password": "any-token"}
        monkeypatch.setenv("AIRFLOW_CONN_HAI_DEFAULT", json.dumps(down))
    params = load_dag(DAG_ID).params
    required = {
        name
        for name in params
        if "null" not in (t if isinstance(t := params.get_param(name).schema["type"], list) else [t])
    }
    for name in required:
        assert params.get_param(name).value not in (None, ""), f"{name} is required but has no default"
    expected = REQUIRED | {"worker_resource_pkg"} if server_up else REQUIRED - {"resource_pkg"}
    assert required == expected
    for name in set(params) - required:
        schema = params.get_param(name).schema
        if "enum" in schema:
            assert params.get_param(name).value in schema["enum"], name


def test_the_priority_field_shows_the_users_remaining_quota(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn("alice-token")
    with server.client("alice-token") as alice:
        alice.submit(
            StandaloneJobSpec(
                task_name="holds 2", code_path="/tmp", cmd="sleep 30", resource_pkg=455, max_schedule=4
            )
        )
    description = str(load_dag(DAG_ID).params.get_param("max_schedule").description)
    # alice's own quota is 8 GPUs and vision's 8; her high-priority job holds 2 of both
    assert "alice 6 of 8 GPUs, group vision 6 of 8 GPUs" in description


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers: a hung server."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


@pytest.mark.parametrize("hung", [pytest.param(False, id="nothing listens"), pytest.param(True, id="hung")])
def test_the_form_falls_back_quickly_when_the_server_is_down(
    hung: bool, silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = silent_port if hung else free_port()
    down = {"conn_type": "hai", "host": f"http://127.0.0.1:{port}", "password": "any-token"}
    monkeypatch.setenv("AIRFLOW_CONN_HAI_DEFAULT", json.dumps(down))
    started = time.monotonic()
    params = load_dag(DAG_ID).params
    took = time.monotonic() - started

    package = params.get_param("resource_pkg")
    assert "enum" not in package.schema and package.schema["type"] == ["null", "integer"]
    assert "could not be reached" in str(package.description) and "`hai res`" in str(package.description)
    assert "High-priority quota left" not in str(params.get_param("max_schedule").description)
    # one request with the form's 2 s timeout, not the client's 30 s; the rest is importing the DAG
    assert took < 8, f"parsing took {took:.1f} s"


STORAGE_CONFIG = HAI_CONFIG + '\n[storages.10111]\npath = "{home}/storage-10111"\ngroups = ["default"]\n'


@pytest.fixture
def storage_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveServer]:
    """The test server with project storage 10111, which group default may mount."""
    (tmp_path / "hai" / "storage-10111").mkdir(parents=True)
    with start_server(tmp_path / "hai", STORAGE_CONFIG) as server:
        monkeypatch.setenv("AIRFLOW_CONN_HAI_DEFAULT", connection_json(server))
        yield server


def test_the_new_fields_reach_the_job(storage_server: LiveServer, tmp_path: Path) -> None:
    model_dir = tmp_path / "models" / "web"
    form = {
        "task_name": "every field",
        "max_schedule": 4,
        "resource_pkg": 455,
        "code_path": str(INCLUDE),
        "cmd": "python3 train.py --steps 4 --ckpt-every 2",
        "model_dir": str(model_dir),
        "project_storage": "10111",
        "shm": 256,
    }
    run = load_dag(DAG_ID).test(run_conf=form)

    assert task_states(run)["submit_standalone"] == "success"
    with storage_server.client() as client:
        (job,) = client.jobs(all=True)
    assert (job.priority, job.max_schedule, job.gpus, job.state) == ("high", 4, 2, "SUCCEEDED")
    assert job.spec["model_dir"] == str(model_dir) and job.spec["project_storage"] == [10111]
    assert job.spec["shm"] == 256 and job.spec["git_branch"] is None
    assert job.latest_checkpoint is not None and Path(job.latest_checkpoint).parent == model_dir


def test_a_nas_job_needs_only_a_name_a_code_path_and_a_command(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn()
    form = {"task_name": "nas only", "code_path": str(INCLUDE), "cmd": "python3 train.py --steps 2"}
    run = load_dag(DAG_ID).test(run_conf=form)

    assert task_states(run) == {
        "check_form": "success",
        "submit_standalone": "success",
        "submit_distributed": "skipped",
        "submit_cpu": "skipped",
    }
    with server.client() as client:
        (job,) = client.jobs(all=True)
    assert (job.task_name, job.mode, job.gpus, job.state) == ("nas only", "standalone", 1, "SUCCEEDED")
    assert job.spec["gpu_type"] is None and job.spec["git_branch"] is None and job.spec["model_dir"] is None


def test_a_cpu_job_from_the_form_holds_no_gpu(hai_conn: Callable[..., LiveServer]) -> None:
    server = hai_conn()
    form = {"task_name": "preprocess", "mode": "cpu", "code_path": str(INCLUDE), "cmd": "true", "cpus": 2}
    run = load_dag(DAG_ID).test(run_conf=form)

    assert task_states(run)["submit_cpu"] == "success"
    with server.client() as client:
        (job,) = client.jobs(all=True)
    assert (job.mode, job.gpus, job.state) == ("cpu", 0, "SUCCEEDED")
    assert (job.spec["cpus"], job.spec["memory_gb"]) == (2, 1)


def test_a_distributed_job_without_workers_is_refused_naming_the_field(
    hai_conn: Callable[..., LiveServer], capfd: pytest.CaptureFixture[str]
) -> None:
    server = hai_conn()
    form = {"mode": "distributed", "workers": None, "code_path": str(INCLUDE), "cmd": "true"}
    run = load_dag(DAG_ID).test(run_conf=form)

    assert task_states(run)["check_form"] == "failed"
    assert (
        "workers (worker数目 Workers): a distributed job needs its number of workers"
        in capfd.readouterr().out
    )
    with server.client() as client:
        assert client.jobs(all=True) == []


def test_a_git_branch_needs_code_from_git(
    hai_conn: Callable[..., LiveServer], capfd: pytest.CaptureFixture[str]
) -> None:
    server = hai_conn()
    run = load_dag(DAG_ID).test(run_conf={"code_src": "nas", "git_branch": "dev", "code_path": str(INCLUDE)})

    assert task_states(run)["check_form"] == "failed"
    assert "`git_branch` is only valid when `code_src` is git" in capfd.readouterr().out
    with server.client() as client:
        assert client.jobs(all=True) == []


def test_high_priority_beyond_the_quota_is_refused_in_the_task_log(
    hai_conn: Callable[..., LiveServer], capfd: pytest.CaptureFixture[str]
) -> None:
    server = hai_conn()
    with server.client() as admin:
        admin.set_user_quota("bob", 0)
    hai_conn("bob-token")
    run = load_dag(DAG_ID).test(run_conf={"max_schedule": 8, "code_path": str(INCLUDE), "cmd": "true"})

    assert task_states(run)["submit_standalone"] == "failed"
    assert "high-priority quota does not cover 1 GPUs" in capfd.readouterr().out
    with server.client() as admin:
        assert admin.jobs(all=True) == []


def test_a_storage_the_platform_does_not_know_is_refused(
    storage_server: LiveServer, capfd: pytest.CaptureFixture[str]
) -> None:
    form = {"project_storage": "10111, 10222", "code_path": str(INCLUDE), "cmd": "true"}
    run = load_dag(DAG_ID).test(run_conf=form)

    assert task_states(run)["submit_standalone"] == "failed"
    assert "10222" in capfd.readouterr().out
    with storage_server.client() as client:
        assert client.jobs(all=True) == []
