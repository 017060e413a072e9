"""`hai serve` with the docker backend: jobs run as containers, outlive a server crash, log via the API."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hai_airflow.spec import StandaloneJobSpec
from tests.support.docker_engine import Engine, docker_server
from tests.support.live_server import LiveServer

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def server(docker_engine: Engine, tmp_path: Path) -> Iterator[tuple[LiveServer, str]]:
    with docker_server(docker_engine, tmp_path / "home") as pair:
        yield pair


def spec(image: str, tmp_path: Path, cmd: str) -> StandaloneJobSpec:
    # Beside $HAI_HOME, not above it: a mount that contains the server's state is refused.
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    return StandaloneJobSpec(
        task_name="docker job", code_path=str(code), cmd=cmd, image=image, resource_pkg=454
    )


def wait_state(live: LiveServer, job_id: int, states: set[str], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    with live.client() as c:
        while True:
            job = c.job(job_id)
            if job.state in states:
                return f"{job.state}: {job.reason}" if job.state == "FAILED" else job.state
            assert time.monotonic() < deadline, f"job {job_id} stayed {job.state}: {live.log_text()[-2000:]}"
            time.sleep(0.2)


def test_a_job_runs_in_a_container_and_its_log_comes_through_the_api(
    server: tuple[LiveServer, str], busybox_image: str, tmp_path: Path
) -> None:
    live, _ = server
    with live.client() as c:
        job = c.submit(spec(busybox_image, tmp_path, 'echo "hello from job $HAI_JOB_ID in $(pwd)"'))
    assert wait_state(live, job.id, {"SUCCEEDED", "FAILED"}) == "SUCCEEDED"
    with live.client() as c:
        (instance,) = c.instances(job.id)
        assert instance.exit_code == 0
        assert c.log(instance.id) == f"hello from job {job.id} in {tmp_path / 'code'}\n"


def test_a_running_container_outlives_a_server_crash_and_is_adopted_again(
    server: tuple[LiveServer, str], busybox_image: str, docker_engine: Engine, tmp_path: Path
) -> None:
    live, owner = server
    with live.client() as c:
        job = c.submit(spec(busybox_image, tmp_path, "echo before; sleep 4; echo after; exit 0"))
    wait_state(live, job.id, {"RUNNING"})
    live.kill9()
    running = docker_engine.client.containers.list(filters={"label": f"hai.owner={owner}"})  # type: ignore[attr-defined]
    assert len(running) == 1  # the job did not die with the server
    live.start()
    assert wait_state(live, job.id, {"SUCCEEDED", "FAILED"}) == "SUCCEEDED"
    with live.client() as c:
        (instance,) = c.instances(job.id)
        assert c.log(instance.id) == "before\nafter\n"


def test_exec_runs_in_the_container_and_cp_reads_its_model_dir(
    server: tuple[LiveServer, str], busybox_image: str, tmp_path: Path
) -> None:
    """`hai exec` is a `docker exec` in the worker's container (its environment, user and dir), killed
    at its timeout by a second exec; `hai cp` reads what the container wrote to its model dir."""
    live, _ = server
    cmd = 'echo saved > "$HAI_MODEL_DIR/model.txt"; touch ready; sleep 600'
    with live.client() as c:
        job = c.submit(spec(busybox_image, tmp_path, cmd))
        wait_state(live, job.id, {"RUNNING"})
        deadline = time.monotonic() + 30
        while not (tmp_path / "code" / "ready").exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        said = list(c.exec(job.id, ["sh", "-c", 'echo "job $HAI_JOB_ID in $(pwd) as $(id -u)"; exit 4']))
        assert said == [
            {"output": f"job {job.id} in {tmp_path / 'code'} as {os.getuid()}\n"},
            {"exit_code": 4, "reason": None},
        ]
        started = time.monotonic()
        said = list(c.exec(job.id, ["sleep", "60"], timeout=1))
        assert said[-1] == {"exit_code": 137, "reason": "killed after its timeout of 1 s"}
        assert time.monotonic() - started < 10
        assert b"".join(c.download(job.id, "model.txt")) == b"saved\n"
        c.cancel(job.id)
