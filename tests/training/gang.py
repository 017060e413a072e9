"""One instance of a per-gpu job started through the platform's rank launcher, outside any server.

The same argv and variables a backend gives each worker (hai_airflow.backends.common.workerenv), so a test
can run `include/train_distributed.py` at one size, stop it, and start it again at another size.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from hai_airflow.backends.common.workerenv import Gang, free_port, gang_env, launcher_argv, worker_slots
from hai_airflow.scheduling.model import WorkerPlacement

BIN = Path(sys.executable).parent


class Instance:
    """The workers of one run of ``cmd``: ``workers`` x ``gpus`` ranks, all output in ``log``."""

    def __init__(self, cmd: str, workers: int, gpus: int, cwd: Path, log: Path, env: dict[str, str]) -> None:
        placement = tuple(WorkerPlacement(f"node{n}", tuple(range(gpus))) for n in range(1, workers + 1))
        slots = worker_slots(placement)
        gang = Gang("127.0.0.1", free_port(), "127.0.0.1", free_port(), "lo", "127.0.0.1")
        base = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(cwd), **env}
        self.log = log
        with log.open("w") as out:
            self.workers = [
                subprocess.Popen(
                    launcher_argv(cmd, slot, gang),
                    env=base | gang_env(slot, len(slots), gang),
                    cwd=cwd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                for slot in slots
            ]

    def wait(self, timeout: float) -> list[int]:
        """Every worker's exit code (the launcher's: 75 when its ranks saved on notice)."""
        try:
            return [w.wait(timeout=timeout) for w in self.workers]
        finally:
            self.stop()

    def stop(self) -> None:
        """Kill whatever of it still runs, with every rank under it."""
        for w in self.workers:
            if w.poll() is None:
                os.killpg(w.pid, signal.SIGKILL)
                w.wait()

    def text(self) -> str:
        return self.log.read_text()
