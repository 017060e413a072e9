"""Re-attaching after a server restart: a NEW LocalBackend adopts or loses what an old one started."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from hai_airflow.backends.common import procs
from hai_airflow.backends.common.base import Handle

from .conftest import Cluster


def restarted(handle: Handle) -> Handle:
    """The handle as the server stores and reloads it: through JSON."""
    return Handle(handle.instance_id, json.loads(json.dumps(dict(handle.data))))


def wait_for_file(path: Path, timeout: float = 3) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_alive_process_is_adopted_and_its_exit_code_read(cluster: Cluster) -> None:
    h = cluster.start("echo started; sleep 1; exit 4")
    cluster.backend.close()
    new = cluster.new_backend()
    assert new.reattach([restarted(h)]) == []
    assert new.poll() == [], "still running: nothing to report yet"
    ended = cluster.wait(h.instance_id, backend=new, timeout=4)
    assert (ended.exit_code, ended.reason, ended.lost) == (4, "exit code 4", False)
    assert new.read_log(h.instance_id) == "started\n"


def test_vanished_process_without_exit_file_is_lost(cluster: Cluster) -> None:
    h = cluster.start("sleep 30")
    cluster.backend.close()
    worker = h.data["workers"][0]
    # The worker dies while no server watches it: killed with its supervisor, no exit file is written.
    os.killpg(worker["pgid"], signal.SIGKILL)
    deadline = time.monotonic() + 2
    while procs.is_alive(worker["pid"], worker["start_time"]):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    new = cluster.new_backend()
    lost = new.reattach([restarted(h)])
    assert [(x.instance_id, x.exit_code, x.lost) for x in lost] == [(h.instance_id, None, True)]
    assert "vanished" in lost[0].reason
    assert new.poll() == [], "a lost instance is reported once, by reattach"


def test_instance_that_ended_during_the_restart_is_reported_by_poll(cluster: Cluster) -> None:
    h = cluster.start("exit 5")
    cluster.backend.close()
    wait_for_file(Path(h.data["workers"][0]["exit_file"]))
    new = cluster.new_backend()
    assert new.reattach([restarted(h)]) == []
    ended = cluster.wait(h.instance_id, backend=new, timeout=1)
    assert (ended.exit_code, ended.lost) == (5, False)


def test_reused_pid_with_another_start_time_is_not_adopted(cluster: Cluster) -> None:
    me = os.getpid()
    started = procs.start_time(me)
    assert started is not None
    data = {
        "backend": "local",
        "log_path": str(cluster.tmp / "x.log"),
        "notice_path": str(cluster.tmp / "notice"),
        "workers": [
            {
                "rank": 0,
                "node": "n",
                "pid": me,
                "pgid": os.getpgid(me),
                "start_time": started + 1,
                "exit_file": str(cluster.tmp / "none.exit"),
                "log_path": str(cluster.tmp / "x.log"),
            }
        ],
    }
    lost = cluster.backend.reattach([Handle(77, data)])
    assert [(x.instance_id, x.lost) for x in lost] == [(77, True)]


def test_stop_after_reattach_kills_the_adopted_instance(cluster: Cluster) -> None:
    h = cluster.start("sleep 30")
    cluster.backend.close()
    new = cluster.new_backend()
    assert new.reattach([restarted(h)]) == []
    new.stop(h.instance_id, grace_seconds=0, notice=False)
    ended = cluster.wait(h.instance_id, backend=new, timeout=1)
    assert (ended.exit_code, ended.reason, ended.lost) == (-9, "killed by signal 9", False)


def test_adopted_distributed_instance_still_fails_fast(cluster: Cluster) -> None:
    cmd = 'if [ "$RANK" = 1 ]; then sleep 0.5; exit 3; fi; sleep 30'
    h = cluster.start(cmd, mode="distributed", gpus=((0,), (1,)))
    cluster.backend.close()
    new = cluster.new_backend()
    assert new.reattach([restarted(h)]) == []
    ended = cluster.wait(h.instance_id, backend=new, timeout=4)
    assert (ended.exit_code, ended.reason) == (3, "worker 1 on node-1 failed: exit code 3")
    w0 = h.data["workers"][0]
    assert not procs.is_alive(w0["pid"], w0["start_time"])


def test_unreadable_handle_is_lost_with_a_reason(cluster: Cluster) -> None:
    lost = cluster.backend.reattach([Handle(5, {"backend": "docker", "container": "abc"})])
    assert [(x.instance_id, x.lost) for x in lost] == [(5, True)]
    assert "docker" in lost[0].reason


# Each worker's shell records its pid and that of a background child: the processes `reap` must end.
RECORDS_PIDS = (
    'sleep 60 & echo "$$ $!" > p.tmp.$HAI_INSTANCE_ID.$RANK; '
    "mv p.tmp.$HAI_INSTANCE_ID.$RANK p.$HAI_INSTANCE_ID.$RANK; wait"
)


def pids_of(cluster: Cluster, handle: Handle) -> dict[int, int]:
    """Pid -> start time of every process of the instance: supervisors, shells, their children."""
    pids = [int(w["pid"]) for w in handle.data["workers"]]
    for w in handle.data["workers"]:
        record = cluster.code / f"p.{handle.instance_id}.{w['rank']}"
        wait_for_file(record)
        pids += [int(p) for p in record.read_text().split()]
    started = {pid: procs.start_time(pid) for pid in pids}
    assert None not in started.values(), "every process runs before the reap"
    return {pid: t for pid, t in started.items() if t is not None}


def test_reap_kills_an_instance_whose_handle_was_never_saved_and_nothing_else(cluster: Cluster) -> None:
    doomed = cluster.start(RECORDS_PIDS, mode="distributed", gpus=((0,), (1,)))
    other = cluster.start(RECORDS_PIDS, mode="distributed", gpus=((2,), (3,)))
    doomed_pids, other_pids = pids_of(cluster, doomed), pids_of(cluster, other)
    cluster.backend.close()  # the server dies before it saves the handle: only the work dir is known

    new = cluster.new_backend()
    new.reap(doomed.instance_id, cluster.tmp / f"instance-{doomed.instance_id}")
    assert [pid for pid, t in doomed_pids.items() if procs.is_alive(pid, t)] == []
    assert [pid for pid, t in other_pids.items() if not procs.is_alive(pid, t)] == []
    new.reap(99, cluster.tmp / "instance-99")  # nothing was started: nothing to do
    assert [pid for pid, t in other_pids.items() if not procs.is_alive(pid, t)] == []
