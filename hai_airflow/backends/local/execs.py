"""`hai exec` on the local backend: the command runs under an exec reaper, as the job's account, with
the environment the worker's command started with."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hai_airflow.backends.common import procs
from hai_airflow.backends.common.execs import READ_BYTES, ExecRefused, ExecRun
from hai_airflow.backends.common.jobuser import JobUser
from hai_airflow.backends.local.spawner import LOCALE_VARIABLES
from hai_airflow.backends.local.supervisor import KILL_TREE_SECONDS, descendants, run_as_value

LOCAL_WRAPPER = 'cd -- "$1" || exit 125; shift; exec "$@"'
"""The local command enters the worker's directory only as the job's account: root never walks it."""
REAPER = Path(__file__).with_name("exec_reaper.py")
REAPER_SECONDS = KILL_TREE_SECONDS + 5.0
"""How long the reaper may take to end a command's tree once told to (it gives up after KILL_TREE_SECONDS)."""


def _pipe_chunks(fd: int) -> Iterator[bytes]:
    while True:
        select.select([fd], [], [])
        try:
            chunk = os.read(fd, READ_BYTES)
        except BlockingIOError:
            continue
        if not chunk:
            return
        yield chunk


def run_local(
    argv: Sequence[str], env: Mapping[str, str], cwd: str, account: JobUser | None, worker: LocalWorker
) -> ExecRun:
    """Run `argv` on this machine as `account` (None: this process's own), in `cwd` (entered after the
    switch), with exactly `env`, under an exec reaper: whatever it starts ends with it, at its kill and
    with the worker. `ExecRefused` when the worker is no longer running."""
    watched = worker.pidfd()
    read, write = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", str(REAPER)],
            stdin=subprocess.PIPE,
            stdout=write,
            stderr=write,
            env={k: v for k, v in os.environ.items() if k in LOCALE_VARIABLES},
            cwd="/",
            start_new_session=True,
            pass_fds=(watched,),
        )
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(write)
        os.close(watched)
    os.set_blocking(read, False)
    run = _ReapedRun(process, read)
    request = {
        "argv": ["/bin/sh", "-c", LOCAL_WRAPPER, "hai-exec", cwd, *argv],
        "env": dict(env),
        "run_as": None if account is None else run_as_value(account.uid, account.gid, account.groups),
        "server": os.getpid(),
        "worker_fd": watched,  # the same number in the reaper (pass_fds)
    }
    try:
        assert process.stdin is not None
        with process.stdin:
            process.stdin.write(json.dumps(request).encode())
    except BaseException:
        run.kill()
        run.close()
        raise
    return ExecRun(
        _pipe_chunks(read), run.exit_code, run.kill, alive=worker.alive, pipe=read, close=run.close
    )


class _ReapedRun:
    """A command under its exec reaper, seen from the server: the reaper's process and output pipe."""

    def __init__(self, process: subprocess.Popen[bytes], pipe: int) -> None:
        self.process, self.pipe = process, pipe
        self._closed = False

    def exit_code(self) -> int | None:
        code = self.process.wait()
        return 128 - code if code < 0 else code

    def kill(self) -> None:
        """Tell the reaper to end the command's whole tree, and wait until it has."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(REAPER_SECONDS)
        except subprocess.TimeoutExpired:  # never seen: kill_tree gives up well before this
            self.process.kill()
            self.process.wait()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self.pipe)


@dataclass(frozen=True)
class LocalWorker:
    """A local worker's supervisor, by pid and start time (a reused pid is not it)."""

    pid: int
    started: int

    def alive(self) -> bool:
        return procs.is_alive(self.pid, self.started)

    def pidfd(self) -> int:
        """A pidfd of the supervisor (readable once it has ended); `ExecRefused` when it is not running."""
        try:
            fd = os.pidfd_open(self.pid)
        except OSError:
            raise ExecRefused("its worker is not running on this machine") from None
        if not self.alive():  # taken after the pidfd: the pidfd is of this very process
            os.close(fd)
            raise ExecRefused("its worker is not running on this machine")
        return fd


def worker_command(supervisor: int, started: int) -> int | None:
    """The pid of a local worker's command (its supervisor's first child); None when the worker is not
    running."""
    if not procs.is_alive(supervisor, started):
        return None
    return next(iter(descendants(supervisor)), None)


def environ(pid: int) -> dict[str, str] | None:
    """The environment a process started with (a job's command: the platform's variables, the job's
    and what the rank launcher adds; the job may have changed its own copy, and the command then runs
    with that, as the same account). None when it is gone."""
    try:
        raw = (procs.PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.decode(errors="surrogateescape").partition("=")
        if sep and name not in env:
            env[name] = value
    return env
