"""An instance's exit reaches the backend's owner at once (`on_exit`), not on the watcher's next tick."""

from __future__ import annotations

import threading
from pathlib import Path

from hai_airflow.backends.common.base import Exit

from .conftest import Cluster
from .test_local_reattach import restarted

SLOW_TICK = {"watch_interval_seconds": 10.0}
"""The watcher's timer at its slowest: an exit seen within it was seen by waiting on the process."""
BEFORE_THE_TICK = 8.0


class Calls:
    """An `on_exit` that counts its calls and lets a test wait for the first."""

    def __init__(self) -> None:
        self.count = 0
        self.first = threading.Event()

    def __call__(self) -> None:
        self.count += 1
        self.first.set()


def test_on_exit_is_called_when_the_worker_exits_and_poll_then_reports_it(cluster: Cluster) -> None:
    backend = cluster.new_backend(**SLOW_TICK)
    calls = Calls()
    backend.on_exit = calls
    h = cluster.start("exit 3", backend=backend)
    assert calls.first.wait(BEFORE_THE_TICK), "the exit waited for the watcher's timer"
    assert backend.poll() == [Exit(h.instance_id, 3, "exit code 3")]
    assert calls.count == 1
    assert backend.poll() == []


def test_on_exit_waits_for_every_worker_of_an_instance(cluster: Cluster) -> None:
    backend = cluster.new_backend(**SLOW_TICK)
    calls = Calls()
    backend.on_exit = calls
    go = cluster.tmp / "go"
    cmd = f'if [ "$RANK" = 1 ]; then while [ ! -e {go} ]; do sleep 0.02; done; fi; exit 0'
    h = cluster.start(cmd, backend=backend, mode="distributed", gpus=((0,), (1,)), processes="per-worker")
    worker0 = h.data["workers"][0]
    assert worker0["rank"] == 0
    # Worker 0 has ended (its supervisor wrote the exit file) while worker 1 waits: nothing to tell.
    exit_file = Path(worker0["exit_file"])
    while not exit_file.exists():
        assert not calls.first.wait(0.02), "on_exit came before the instance ended"
    assert not calls.first.wait(0.3) and backend.poll() == []
    go.touch()
    assert calls.first.wait(BEFORE_THE_TICK), "the last worker's exit waited for the watcher's timer"
    assert backend.poll() == [Exit(h.instance_id, 0, "completed")]


def test_an_adopted_worker_s_exit_is_seen_at_once_too(cluster: Cluster) -> None:
    go = cluster.tmp / "go"
    h = cluster.start(f"while [ ! -e {go} ]; do sleep 0.02; done; exit 2")
    cluster.backend.close()
    new = cluster.new_backend(**SLOW_TICK)
    calls = Calls()
    new.on_exit = calls
    assert new.reattach([restarted(h)]) == []
    assert new.poll() == []
    go.touch()
    assert calls.first.wait(BEFORE_THE_TICK), "the adopted worker's exit waited for the watcher's timer"
    assert new.poll() == [Exit(h.instance_id, 2, "exit code 2")]
