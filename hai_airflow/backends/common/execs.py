"""`hai exec`: a command run in a running worker's environment, as the job's account.

Each backend answers `exec_in(handle, rank, argv)` with an `ExecRun`: the command's combined output as
it comes, how it ended, and a way to end it early (the caller hung up, or the job's run ended). The
command gets no stdin and no terminal: it is for a look (`nvidia-smi`, `ls`, `py-spy dump`), not a
shell session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from hai_airflow.backends.common.base import Handle
from hai_airflow.backends.common.jobuser import JobUser

READ_BYTES = 65536
CONTAINER_WRAPPER = 'echo "$$"; exec "$@"'
"""What a container runs in place of the command: its pid in the container (the first output line,
which `ContainerExec` keeps to itself) so it can be killed from a second exec, then the command."""


class ExecRefused(Exception):
    """The command cannot run in that worker: the message says why (not running, another node...)."""


@dataclass
class ExecRun:
    """A command started in a worker.

    `output` yields its stdout and stderr together as they come, until both close; `exit_code()`
    then says how it ended (128 + N for signal N; None when the backend could not tell); `kill()` ends
    it early and is safe to call at any time, also after it ended. Each of them may block (a pipe, an
    engine's or API server's answer): the server calls them apart from the threads that serve requests.
    """

    output: Iterator[bytes]
    exit_code: Callable[[], int | None]
    kill: Callable[[], None]
    alive: Callable[[], bool] = lambda: True
    """Whether the worker it runs in is still there: the command is killed once it is not."""
    pipe: int | None = None
    """The output's pipe, non-blocking, where the output comes through one (local): read it without a
    thread, in place of `output`. It stays open until `close()`."""
    close: Callable[[], None] = lambda: None
    """Release what the run holds (its pipe), once it has ended or been killed: called once, last."""


@runtime_checkable
class Exec(Protocol):
    """A backend that runs commands in its running workers, and says whose account its jobs use."""

    def account(self, owner: str) -> JobUser | None:
        """The OS account the jobs of `owner` run as (None: the server's own); KeyError when the
        account the config names does not exist."""

    def exec_in(self, handle: Handle, rank: int, argv: Sequence[str], owner: str) -> ExecRun:
        """Start `argv` in worker `rank` of the instance as the job's account; `ExecRefused` when it
        cannot."""


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
