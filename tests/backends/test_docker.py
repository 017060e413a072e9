"""The docker backend against a real engine: env, labels, limits, exits, logs, stops, reattach, gangs."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hai_airflow.backends.common.base import Handle, StartError
from tests.support.docker_engine import DockerJobs, Engine

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def jobs(docker_engine: Engine, busybox_image: str, tmp_path: Path) -> Iterator[DockerJobs]:
    j = DockerJobs(docker_engine, tmp_path, busybox_image)
    try:
        yield j
    finally:
        j.cleanup()


def env_of(log: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in log.splitlines() if "=" in line)


def wait_for(predicate, what: str, timeout: float = 15) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.05)


def test_standalone_container_env_labels_limits_exit_code_and_log(jobs: DockerJobs) -> None:
    launch = jobs.launch(
        'env; echo "cwd=$(pwd)"; echo "shm=$(df -m /dev/shm | tail -1 | awk \'{print $2}\')"; '
        "echo to-stderr >&2; sleep 1; echo last; exit 3",
        gpus=((2, 5),),
        cpus=1.5,
        memory_gb=0.25,
        shm=64,
        env={"EXTRA": "x y"},
    )
    launch = dataclasses.replace(launch, log_bytes=3 << 20)  # [limits] log_bytes_per_instance
    handle = jobs.backend.start(launch)
    (container,) = jobs.containers(launch.instance_id)
    assert container.labels["hai.job-id"] == str(launch.job_id)
    assert container.labels["hai.instance-id"] == str(launch.instance_id)
    host_config = container.attrs["HostConfig"]
    assert host_config["NanoCpus"] == 1_500_000_000
    assert host_config["Memory"] == 256 * 1024**2
    assert host_config["ShmSize"] == 64 * 1024**2
    assert host_config["Init"] is True
    # The engine keeps at most the instance's log share of output, so the kept log is bounded too.
    assert host_config["LogConfig"] == {
        "Type": "json-file",
        "Config": {"max-size": str(3 << 20), "max-file": "1"},
    }
    assert handle.data["containers"] == [container.name]

    ended = jobs.wait(launch.instance_id)
    assert (ended.exit_code, ended.reason, ended.lost) == (3, "exit code 3", False)
    log = launch.log_path.read_text()
    env = env_of(log)
    assert env["cwd"] == str(jobs.code)
    assert env["shm"] == "64"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,5"  # virtual GPUs: the placement's indices, as locally
    assert env["HAI_JOB_ID"] == str(launch.job_id)
    assert env["HAI_PREEMPT_NOTICE"] == str(launch.notice_path)
    assert env["EXTRA"] == "x y"
    assert "RANK" not in env
    assert "to-stderr" in log
    # The log is kept and the container removed once its exit has been reported.
    assert jobs.containers(launch.instance_id) == []
    assert jobs.backend.read_log(launch.instance_id, tail=1) == "last\n"


def test_read_log_while_running_and_follow_until_the_end(jobs: DockerJobs) -> None:
    launch = jobs.launch("for i in 1 2 3; do echo line-$i; sleep 0.3; done")
    jobs.backend.start(launch)
    wait_for(lambda: "line-1" in jobs.backend.read_log(launch.instance_id), "first line in the log")
    followed = "".join(jobs.backend.follow_log(launch.instance_id))
    assert followed.splitlines() == ["line-1", "line-2", "line-3"]
    assert jobs.wait(launch.instance_id).exit_code == 0
    assert jobs.backend.read_log(launch.instance_id) == "line-1\nline-2\nline-3\n"


def test_missing_image_fails_at_once_without_pulling(jobs: DockerJobs) -> None:
    launch = jobs.launch("true", image="registry.invalid/hai/absent:1")
    started = time.monotonic()
    with pytest.raises(StartError) as err:
        jobs.backend.start(launch)
    host = jobs.backend.host
    assert str(err.value) == (
        f"image registry.invalid/hai/absent:1 is not present on host {host}; build or load it first"
    )
    assert time.monotonic() - started < 5
    assert jobs.containers() == []


def test_real_gpus_are_requested_from_the_engine(jobs: DockerJobs) -> None:
    """Without virtual_gpus the placement's GPUs go to the engine as a device request."""
    backend = jobs.new_backend(virtual_gpus=False)
    launch = jobs.launch("true", gpus=((1, 3),))
    try:
        backend.start(launch)
    except StartError as e:
        # This engine has no NVIDIA runtime: the request is refused, and the start fails cleanly.
        assert "could not select device driver" in str(e)
        assert jobs.containers(launch.instance_id) == []
        return
    (container,) = jobs.containers(launch.instance_id)
    (request,) = container.attrs["HostConfig"]["DeviceRequests"]
    assert request["DeviceIDs"] == ["1", "3"]


def test_suspend_kills_a_non_elastic_job_at_once(jobs: DockerJobs) -> None:
    launch = jobs.launch("echo started; sleep 300")
    jobs.backend.start(launch)
    wait_for(lambda: "started" in jobs.backend.read_log(launch.instance_id), "the job's start")
    asked = time.monotonic()
    jobs.backend.stop(launch.instance_id, grace_seconds=0, notice=False)
    ended = jobs.wait(launch.instance_id)
    assert time.monotonic() - asked < 10
    assert ended.exit_code == 137  # SIGKILL
    assert ended.reason == "killed by signal 9 (exit code 137)"
    assert not (launch.notice_path).exists()


ELASTIC = """
trap 'echo got-sigterm' TERM
while [ ! -f "$HAI_PREEMPT_NOTICE" ]; do sleep 0.1; done
echo "notice: $(cat "$HAI_PREEMPT_NOTICE")"
sleep 1 & wait
sleep 1
echo saved
exit 75
"""


def test_elastic_stop_writes_the_notice_then_sigterm_and_the_job_exits_by_itself(jobs: DockerJobs) -> None:
    (jobs.code / "elastic.sh").write_text(ELASTIC)
    launch = jobs.launch("sh elastic.sh", elastic=True)
    jobs.backend.start(launch)
    wait_for(lambda: bool(jobs.containers(launch.instance_id)[0].status == "running"), "running")
    time.sleep(0.5)
    asked = time.monotonic()
    jobs.backend.stop(launch.instance_id, grace_seconds=30, notice=True)
    ended = jobs.wait(launch.instance_id, timeout=30)
    took = time.monotonic() - asked
    log = jobs.backend.read_log(launch.instance_id)
    assert "got-sigterm" in log
    notice = json.loads(log.split("notice: ", 1)[1].splitlines()[0])
    assert notice["grace_seconds"] == 30 and notice["instance_id"] == launch.instance_id
    assert "saved" in log
    # The job's own exit code survives the shell that runs it, and it was not killed at the grace.
    assert ended.exit_code == 75
    assert took < 20


def test_elastic_job_that_ignores_the_notice_is_killed_after_the_grace(jobs: DockerJobs) -> None:
    launch = jobs.launch("trap '' TERM; echo started; while true; do sleep 0.2; done", elastic=True)
    jobs.backend.start(launch)
    wait_for(lambda: "started" in jobs.backend.read_log(launch.instance_id), "the job's start")
    asked = time.monotonic()
    jobs.backend.stop(launch.instance_id, grace_seconds=2, notice=True)
    ended = jobs.wait(launch.instance_id, timeout=30)
    took = time.monotonic() - asked
    assert (launch.notice_path).exists()
    assert ended.exit_code == 137
    assert 1.5 < took < 15


def test_a_new_backend_reattaches_running_containers_by_label(jobs: DockerJobs) -> None:
    running = jobs.launch("echo first; sleep 2; echo second; exit 4")
    handle = jobs.backend.start(running)
    gone = jobs.launch("sleep 300")
    gone_handle = jobs.backend.start(gone)
    orphan = jobs.launch("sleep 300")
    jobs.backend.start(orphan)  # started but never recorded by the server
    jobs.backend.close()
    for c in jobs.containers(gone.instance_id):
        c.remove(force=True)

    restarted = jobs.new_backend()
    stored = [Handle(h.instance_id, json.loads(json.dumps(dict(h.data)))) for h in (handle, gone_handle)]
    lost = restarted.reattach(stored)
    assert [(e.instance_id, e.exit_code, e.lost) for e in lost] == [(gone.instance_id, None, True)]
    assert jobs.containers(orphan.instance_id) == []  # it would have run twice beside its requeued job
    assert "first" in restarted.read_log(running.instance_id)
    ended = jobs.wait(running.instance_id, backend=restarted)
    assert ended.exit_code == 4
    assert running.log_path.read_text() == "first\nsecond\n"


def test_a_failed_worker_stops_its_gang(jobs: DockerJobs) -> None:
    launch = jobs.launch(
        'if [ "$RANK" = 1 ]; then sleep 0.5; exit 9; fi; sleep 300',
        mode="distributed",
        gpus=((0,), (1,)),
        processes="per-worker",  # busybox: no python3 for the rank launcher
    )
    jobs.backend.start(launch)
    ended = jobs.wait(launch.instance_id, timeout=30)
    assert ended.exit_code == 9
    assert ended.reason == "worker 1 failed: exit code 9"


RENDEZVOUS = """
echo "rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK hvd=$HOROVOD_RANK/$HOROVOD_SIZE"
echo "master=$MASTER_ADDR:$MASTER_PORT"
got=/tmp/got
if [ "$RANK" = 0 ]; then
  # busybox nc -l can end on its own stdin's end before the data arrives: listen until some does.
  until [ -s $got ]; do nc -l -p "$MASTER_PORT" > $got; done
  echo "rank 0 got: $(cat $got)"
else
  i=0
  until echo "hello from rank 1" | nc "$MASTER_ADDR" "$MASTER_PORT"; do
    i=$((i+1)); [ $i -gt 100 ] && exit 1; sleep 0.1
  done
  # Rank 0 may have missed it (above): say it again until rank 0 no longer listens.
  while [ $i -lt 200 ] && echo "hello from rank 1" | nc "$MASTER_ADDR" "$MASTER_PORT" 2>/dev/null; do
    i=$((i+1)); sleep 0.1
  done
fi
"""


def test_distributed_workers_share_a_network_and_reach_rank_0(jobs: DockerJobs) -> None:
    (jobs.code / "rendezvous.sh").write_text(RENDEZVOUS)
    launch = jobs.launch(
        "sh rendezvous.sh", mode="distributed", gpus=((0, 1), (2, 3)), processes="per-worker"
    )
    jobs.backend.start(launch)
    containers = sorted(jobs.containers(launch.instance_id), key=lambda c: c.name)
    assert [c.labels["hai.worker"] for c in containers] == ["0", "1"]
    network = f"hai-{launch.instance_id}"
    assert all(list(c.attrs["NetworkSettings"]["Networks"]) == [network] for c in containers)
    ended = jobs.wait(launch.instance_id, timeout=60)
    log = launch.log_path.read_text()
    assert ended.exit_code == 0, log
    assert "[worker 0] rank=0 world=2 local=0 hvd=0/2" in log
    assert "[worker 1] rank=1 world=2 local=0 hvd=1/2" in log
    assert f"[worker 1] master=hai-{launch.instance_id}-w0:29500" in log
    assert "[worker 0] rank 0 got: hello from rank 1" in log
    assert jobs.engine.client.networks.list(names=[network]) == []  # type: ignore[attr-defined]


def test_git_code_is_checked_out_and_mounted(jobs: DockerJobs, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "main.sh").write_text("echo from-git-$(cat version)\n")
    (repo / "version").write_text("7\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@e", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    launch = jobs.launch("sh main.sh; sleep 1", code_src="git", code_path=str(repo), git_branch="main")
    handle = jobs.backend.start(launch)
    # start() only starts the clone, off the controller's loop; poll() creates the containers after it.
    assert jobs.containers(launch.instance_id) == []
    assert handle.data["containers"] == [f"hai-{launch.instance_id}-w0"]
    exits = []
    deadline = time.monotonic() + 30
    while not jobs.containers(launch.instance_id):
        assert time.monotonic() < deadline, "the containers did not start after the clone"
        exits += jobs.backend.poll()
        time.sleep(0.05)
    assert exits == []
    (container,) = jobs.containers(launch.instance_id)
    assert container.attrs["Config"]["WorkingDir"] == str(launch.work_dir / "code")
    ended = jobs.wait(launch.instance_id)
    assert ended.exit_code == 0
    assert launch.log_path.read_text() == "from-git-7\n"


def test_reap_removes_the_containers_of_an_instance_never_recorded(jobs: DockerJobs) -> None:
    kept, orphan = jobs.launch("sleep 300"), jobs.launch("sleep 300")
    jobs.backend.start(kept)
    jobs.backend.start(orphan)  # started, but the server died before recording it
    jobs.backend.close()
    jobs.new_backend().reap(orphan.instance_id, orphan.work_dir)
    assert jobs.containers(orphan.instance_id) == []
    assert len(jobs.containers(kept.instance_id)) == 1


def test_a_per_gpu_job_in_an_image_without_python_fails_saying_what_to_change(jobs: DockerJobs) -> None:
    launch = jobs.launch("true", mode="distributed", gpus=((0,), (1,)))
    jobs.backend.start(launch)
    ended = jobs.wait(launch.instance_id, timeout=30)
    assert ended.exit_code == 127
    assert "this image has no python3" in launch.log_path.read_text()
    assert "processes = per-worker" in launch.log_path.read_text()
