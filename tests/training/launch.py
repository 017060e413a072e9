"""Launching test jobs: a clean environment, free ports, waiting, and processes that never outlive a test."""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "include"
JOBS = Path(__file__).resolve().parent / "jobs"

# Everything a platform or launcher may set that changes what the helpers do.
JOB_VARS = (
    "HAI_MODEL_DIR",
    "HAI_CHECKPOINT_DIR",
    "HAI_LATEST_CHECKPOINT",
    "HAI_RESUME",
    "HAI_PREEMPT_NOTICE",
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def job_env(**extra: str) -> dict[str, str]:
    """The test process's environment without job variables, single-threaded, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in JOB_VARS}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class Job:
    """A started test job whose output is read in the background, so a silent job cannot hang a test."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, *args],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._unread: queue.Queue[str | None] = queue.Queue()
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self._unread), daemon=True),
            threading.Thread(target=self._read, args=(self.process.stderr, None), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: object, into: queue.Queue[str | None] | None) -> None:
        assert hasattr(stream, "readline")
        for line in iter(stream.readline, ""):
            if into is None:
                self.stderr_lines.append(line)
            else:
                self.lines.append(line.rstrip("\n"))
                into.put(line.rstrip("\n"))
        if into is not None:
            into.put(None)

    def expect(self, prefix: str, timeout: float = 60) -> str:
        """The next stdout line starting with ``prefix``; fails if the job ends or stays silent first."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._unread.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                silent = f"no line starting {prefix!r} within {timeout}s"
                raise AssertionError(f"{silent}; {self.describe()}") from None
            if line is None:
                raise AssertionError(f"job ended before a line starting {prefix!r}; {self.describe()}")
            if line.startswith(prefix):
                return line

    def wait(self, timeout: float = 60) -> int:
        """Exit status, after the output has been read to the end."""
        code = self.process.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=10)
        return code

    def kill(self) -> None:
        self.process.kill()
        self.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.wait(timeout=30)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()

    @property
    def stderr(self) -> str:
        return "".join(self.stderr_lines)

    def describe(self) -> str:
        tail = "\n".join(self.lines[-10:])
        return f"exit {self.process.poll()}; stdout tail:\n{tail}\nstderr:\n{self.stderr[-3000:]}"
