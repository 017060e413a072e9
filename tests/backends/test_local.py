"""The local backend with real processes: environment, working directory, exit codes, logs, stops."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from hai_airflow.backends.common import procs
from hai_airflow.backends.common.base import StartError
from hai_airflow.backends.local import backend as local

from .conftest import Cluster

# GPU indices in placements are fakes: these processes only see CUDA_VISIBLE_DEVICES, no GPU is used.


def log_lines(cluster: Cluster, instance_id: int) -> list[str]:
    return cluster.backend.read_log(instance_id).splitlines()


def wait_for_log(cluster: Cluster, instance_id: int, text: str, timeout: float = 3) -> None:
    deadline = time.monotonic() + timeout
    while text not in cluster.backend.read_log(instance_id):
        assert time.monotonic() < deadline, f"{text!r} never appeared in the log"
        time.sleep(0.02)


def test_standalone_job_sees_its_environment_and_starts_in_code_path(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server's own environment never reaches a job.
    monkeypatch.setenv("HAI_TEST_OUTER", "from-server")
    cmd = (
        'echo "cwd=$(pwd)"; echo "CVD=$CUDA_VISIBLE_DEVICES"; echo "JOB=$HAI_JOB_ID"; '
        'echo "EXTRA=$EXTRA"; echo "OUTER=$HAI_TEST_OUTER"; echo "RANK=${RANK-unset}"; '
        'echo "NODE=$HAI_NODE GPW=$HAI_GPUS_PER_WORKER IDX=$HAI_WORKER_INDEX"'
    )
    h = cluster.start(cmd, gpus=((2, 5),), env={"EXTRA": "x y"})
    ended = cluster.wait(h.instance_id)
    assert (ended.exit_code, ended.reason, ended.lost) == (0, "completed", False)
    assert log_lines(cluster, h.instance_id) == [
        f"cwd={cluster.code}",
        "CVD=2,5",
        "JOB=101",
        "EXTRA=x y",
        "OUTER=",
        "RANK=unset",
        "NODE=node-0 GPW=2 IDX=0",
    ]
    assert cluster.backend.poll() == [], "an ended instance is reported exactly once"


def test_cpu_job_sees_an_empty_cuda_visible_devices(cluster: Cluster) -> None:
    h = cluster.start('echo "CVD=[${CUDA_VISIBLE_DEVICES-unset}]"', mode="cpu", gpus=((),))
    assert cluster.wait(h.instance_id).exit_code == 0
    assert log_lines(cluster, h.instance_id) == ["CVD=[]"]


def test_failure_reports_the_exit_code_and_keeps_stderr_in_the_log(cluster: Cluster) -> None:
    h = cluster.start("echo oops >&2; exit 3")
    ended = cluster.wait(h.instance_id)
    assert (ended.exit_code, ended.reason) == (3, "exit code 3")
    assert log_lines(cluster, h.instance_id) == ["oops"]


def test_read_log_tail_keeps_the_last_lines(cluster: Cluster) -> None:
    h = cluster.start("for i in 1 2 3 4 5; do echo line$i; done")
    cluster.wait(h.instance_id)
    assert cluster.backend.read_log(h.instance_id, tail=2) == "line4\nline5\n"
    assert cluster.backend.read_log(h.instance_id, tail=0).count("\n") == 5
    with pytest.raises(KeyError):
        cluster.backend.read_log(999)


def test_follow_log_yields_while_running_and_stops_after_the_end(cluster: Cluster) -> None:
    h = cluster.start("echo first; sleep 0.6; echo second")
    chunks = list(cluster.backend.follow_log(h.instance_id))
    assert "".join(chunks) == "first\nsecond\n"
    assert chunks[0] == "first\n", "the first line arrives before the job ends"


def test_stop_without_notice_kills_the_whole_process_group_within_a_second(cluster: Cluster) -> None:
    h = cluster.start("sleep 30 & echo $! > child.pid; echo ready; wait")
    wait_for_log(cluster, h.instance_id, "ready")
    child = int((cluster.code / "child.pid").read_text())
    child_start = procs.start_time(child)
    assert child_start is not None
    t0 = time.monotonic()
    cluster.backend.stop(h.instance_id, grace_seconds=0, notice=False)
    ended = cluster.wait(h.instance_id, timeout=1)
    assert time.monotonic() - t0 < 1
    assert (ended.exit_code, ended.reason) == (-9, "killed by signal 9")
    assert not procs.is_alive(child, child_start), "a background child of the job survived the kill"
    assert not Path(h.data["notice_path"]).exists()


def test_elastic_stop_writes_the_notice_and_a_clean_exit_in_grace_counts(cluster: Cluster) -> None:
    cmd = (
        "trap 'test -f \"$HAI_PREEMPT_NOTICE\" && echo notice-seen; exit 0' TERM; "
        "echo ready; while :; do sleep 0.05; done"
    )
    h = cluster.start(cmd, elastic=True)
    wait_for_log(cluster, h.instance_id, "ready")
    cluster.backend.stop(h.instance_id, grace_seconds=5, notice=True)
    ended = cluster.wait(h.instance_id, timeout=3)
    assert (ended.exit_code, ended.reason) == (0, "completed")
    assert "notice-seen" in cluster.backend.read_log(h.instance_id)
    notice = Path(h.data["notice_path"])
    assert notice == cluster.tmp / "instance-1" / "preempt-notice"
    assert json.loads(notice.read_text())["grace_seconds"] == 5


SAVES_ON_SIGTERM = """
import pathlib, signal, sys, time

def save_and_leave(signum, frame):
    time.sleep(1)  # a checkpoint being written
    pathlib.Path("saved.ckpt").write_text("weights")
    sys.exit(75)

signal.signal(signal.SIGTERM, save_and_leave)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize(
    ("cmd", "where"),
    [
        pytest.param("python3 save.py", ".", id="plain command"),
        pytest.param("cd job && python3 save.py", "job", id="cd then the command"),
    ],
)
def test_elastic_stop_lets_a_command_run_by_the_shell_save_and_records_its_exit_75(
    cluster: Cluster, cmd: str, where: str
) -> None:
    code = cluster.code / where
    code.mkdir(exist_ok=True)
    (code / "save.py").write_text(SAVES_ON_SIGTERM)
    h = cluster.start(cmd, elastic=True)
    wait_for_log(cluster, h.instance_id, "ready")
    t0 = time.monotonic()
    cluster.backend.stop(h.instance_id, grace_seconds=10, notice=True)
    time.sleep(0.5)
    assert cluster.backend.poll() == [], "the worker was reported ended while its command was saving"
    ended = cluster.wait(h.instance_id, timeout=5)
    assert time.monotonic() - t0 >= 1
    assert (ended.exit_code, ended.reason) == (75, "exit code 75")
    assert (code / "saved.ckpt").read_text() == "weights"
    assert Path(h.data["workers"][0]["exit_file"]).read_text().strip() == "75"


def test_a_command_that_dies_of_sigterm_is_still_reported_killed_by_it(cluster: Cluster) -> None:
    h = cluster.start("cd . && echo ready && sleep 30; echo never")
    wait_for_log(cluster, h.instance_id, "ready")
    cluster.backend.stop(h.instance_id, grace_seconds=5, notice=True)
    ended = cluster.wait(h.instance_id, timeout=2)
    assert (ended.exit_code, ended.reason) == (-15, "killed by signal 15")
    assert "never" not in cluster.backend.read_log(h.instance_id), "the shell went on after SIGTERM"


def test_job_ignoring_sigterm_is_killed_after_the_grace(cluster: Cluster) -> None:
    h = cluster.start("trap '' TERM; echo ready; sleep 30")
    wait_for_log(cluster, h.instance_id, "ready")
    t0 = time.monotonic()
    cluster.backend.stop(h.instance_id, grace_seconds=1, notice=True)
    time.sleep(0.5)
    assert cluster.backend.poll() == [], "killed before the grace ran out"
    ended = cluster.wait(h.instance_id, timeout=2)
    assert 1 <= time.monotonic() - t0 < 2
    assert (ended.exit_code, ended.reason) == (-9, "killed by signal 9")


def test_grace_without_notice_sends_sigterm_and_writes_no_notice(cluster: Cluster) -> None:
    h = cluster.start("echo ready; sleep 30")
    wait_for_log(cluster, h.instance_id, "ready")
    cluster.backend.stop(h.instance_id, grace_seconds=5, notice=False)
    ended = cluster.wait(h.instance_id, timeout=2)
    assert (ended.exit_code, ended.reason) == (-15, "killed by signal 15")
    assert not Path(h.data["notice_path"]).exists()


def test_missing_code_path_is_a_start_error(cluster: Cluster) -> None:
    launch = cluster.launch("true", code_path=str(cluster.tmp / "nowhere"))
    with pytest.raises(StartError, match=r"code_path .*nowhere is not a directory"):
        cluster.backend.start(launch)


def test_configured_image_puts_its_environment_first_on_path(cluster: Cluster) -> None:
    venv = cluster.tmp / "venvs" / "torch-img"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "hello").write_text("#!/bin/sh\necho hello from the image\n")
    (venv / "bin" / "hello").chmod(0o755)
    backend = cluster.new_backend(images={"torch-img": str(venv)})
    h = cluster.start('hello; echo "VENV=$VIRTUAL_ENV"', backend=backend, image="torch-img")
    assert cluster.wait(h.instance_id, backend=backend).exit_code == 0
    assert backend.read_log(h.instance_id).splitlines() == ["hello from the image", f"VENV={venv}"]
    other = cluster.start("true", backend=backend, image="registry/unknown:1")
    assert other.data["image"] == "registry/unknown:1", "an image without a venv is recorded only"
    assert cluster.wait(other.instance_id, backend=backend).exit_code == 0


def test_unknown_option_is_refused_with_its_name(cluster: Cluster) -> None:
    with pytest.raises(ValueError, match="imagez"):
        cluster.new_backend(imagez={})


def test_a_job_that_moves_its_work_dir_away_still_reports_how_it_ended(cluster: Cluster) -> None:
    # $HOME is the work dir. The exit file lies beside it, where the job cannot reach.
    h = cluster.start('mv "$HOME" "$HOME.moved" && ln -s /tmp "$HOME" && exit 6')
    ended = cluster.wait(h.instance_id)
    assert (ended.exit_code, ended.reason, ended.lost) == (6, "exit code 6", False)


def test_a_worker_that_cannot_be_started_leaves_none_of_the_instance_running(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Worker 1's start fails (as when the spawner dies before it answers): an injected failure, the
    # processes around it are real.
    real = cluster.backend._spawner.spawn
    started: list[int] = []

    def second_fails(*args: Any) -> tuple[int, int]:
        if started:
            raise OSError("the spawner ended before it answered")
        pid, t = real(*args)
        started.append(pid)
        return pid, t

    monkeypatch.setattr(cluster.backend._spawner, "spawn", second_fails)
    with pytest.raises(StartError, match="could not start worker 1: the spawner ended"):
        cluster.start("sleep 60", mode="distributed", gpus=((0,), (1,)))
    (first,) = started
    deadline = time.monotonic() + 5
    while procs.start_time(first) is not None:
        assert time.monotonic() < deadline, "worker 0 was left running"
        time.sleep(0.02)


def test_the_backend_forgets_the_oldest_ended_instances_beyond_the_ones_it_keeps(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local, "ENDED_KEPT", 2)
    started = []
    for i in range(3):
        started.append(cluster.start(f"echo run{i}"))
        cluster.wait(started[-1].instance_id)
    running = cluster.start("sleep 30")
    with pytest.raises(KeyError):
        cluster.backend.read_log(started[0].instance_id)  # memory stays bounded on a long-lived server
    assert [log_lines(cluster, h.instance_id) for h in started[1:]] == [["run1"], ["run2"]]
    assert log_lines(cluster, running.instance_id) == []  # a running one is never forgotten
    cluster.backend.stop(running.instance_id, 0, False)
    assert cluster.wait(running.instance_id).exit_code is not None
