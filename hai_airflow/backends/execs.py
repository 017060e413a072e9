"""`hai exec`: a command run in a running worker's environment, as the job's account.

Each backend answers `exec_in(handle, rank, argv)` with an `ExecRun`: the command's combined output as
it comes, how it ended, and a way to end it early (the caller hung up, or the job's run ended). The
command gets no stdin and no terminal: it is for a look (`nvidia-smi`, `ls`, `py-spy dump`), not a
shell session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from hai_airflow.backends import procs
from hai_airflow.backends.base import Handle
from hai_airflow.backends.jobuser import JobUser
from hai_airflow.backends.supervisor import descendants

READ_BYTES = 65536
CONTAINER_WRAPPER = 'echo "$$"; exec "$@"'
"""What a container runs in place of the command: its pid in the container (the first output line,
which `ContainerExec` keeps to itself) so it can be killed from a second exec, then the command."""
LOCAL_WRAPPER = 'cd -- "$1" || exit 125; shift; exec "$@"'
"""The local command enters the worker's directory only as the job's account: root never walks it."""


class ExecRefused(Exception):
    """The command cannot run in that worker: the message says why (not running, another node...)."""


@dataclass
class ExecRun:
    """A command started in a worker.

    `output` yields its stdout and stderr together as they come, until both close; `exit_code()`
    then says how it ended (128 + N for signal N; None when the backend could not tell); `kill()` ends
    it early and is safe to call at any time, also after it ended.
    """

    output: Iterator[bytes]
    exit_code: Callable[[], int | None]
    kill: Callable[[], None]
    alive: Callable[[], bool] = lambda: True
    """Whether the worker it runs in is still there: the command is killed once it is not."""


@runtime_checkable
class Exec(Protocol):
    """A backend that runs commands in its running workers, and says whose account its jobs use."""

    def account(self, owner: str) -> JobUser | None:
        """The OS account the jobs of `owner` run as (None: the server's own); KeyError when the
        account the config names does not exist."""

    def exec_in(self, handle: Handle, rank: int, argv: Sequence[str], owner: str) -> ExecRun:
        """Start `argv` in worker `rank` of the instance as the job's account; `ExecRefused` when it
        cannot."""


def _pipe_chunks(fd: int) -> Iterator[bytes]:
    while chunk := os.read(fd, READ_BYTES):
        yield chunk


def run_local(
    argv: Sequence[str], env: Mapping[str, str], cwd: str, account: JobUser | None, alive: Callable[[], bool]
) -> ExecRun:
    """Run `argv` on this machine in a session of its own as `account` (None: this process's own),
    in `cwd` (entered after the switch), with exactly `env`."""
    process = subprocess.Popen(
        ["/bin/sh", "-c", LOCAL_WRAPPER, "hai-exec", cwd, *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env),
        cwd="/",
        start_new_session=True,
        close_fds=True,
        user=None if account is None else account.uid,
        group=None if account is None else account.gid,
        extra_groups=None if account is None else list(account.groups),
    )
    assert process.stdout is not None
    out = process.stdout

    def kill() -> None:
        if process.poll() is None:
            procs.signal_group(process.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            out.close()

    def exit_code() -> int | None:
        code = process.wait()
        out.close()
        # What the command left running in its session ends with it, as a job's leftovers do.
        procs.signal_group(process.pid, signal.SIGKILL)
        return 128 - code if code < 0 else code

    return ExecRun(_pipe_chunks(out.fileno()), exit_code, kill, alive)


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


def split_pid(chunks: Iterator[bytes], found: Callable[[int], None]) -> Iterator[bytes]:
    """The output of a command run by `CONTAINER_WRAPPER`, its first line (the pid) given to `found`."""
    head = b""
    for chunk in chunks:
        head += chunk
        line, sep, rest = head.partition(b"\n")
        if sep and line.isdigit():
            found(int(line))
            head = rest
            break
        if sep or len(head) > 64:  # not a pid: whatever it is, it is output
            break
    if head:
        yield head
    yield from chunks
