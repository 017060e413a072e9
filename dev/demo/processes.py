"""The processes the demo starts, each in its own session, and stopping every one of them, from /proc."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from dev.demo import REPO


def descendants(roots: Sequence[int]) -> list[int]:
    """Every live process below `roots` (children, theirs...), from /proc; a process that has
    started a session of its own is still found through its parent."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # the command name, in parentheses, may hold spaces: the fields after it are fixed
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(stat[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def processes_with(variable: Callable[[bytes], bool]) -> list[int]:
    """Processes (not this one) with an environment variable (b"NAME=value") that `variable` accepts."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(variable(v) for v in environ):
            found.append(int(entry.name))
    return found


def _signal_all(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class Stack:
    """The processes this run started, each in its own session, and everything they start.

    :param marker: an environment variable (NAME=value) every process of the stack carries, so a
        process that escaped its parent is still stopped.
    """

    def __init__(self, marker: str | None = None) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.marker = marker

    def start(
        self, name: str, args: Sequence[str], env: dict[str, str], log_path: Path
    ) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                list(args),
                env=env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs.append((name, proc))
        return proc

    def _marked(self) -> list[int]:
        marker = self.marker.encode() if self.marker else None
        return processes_with(lambda v: v == marker) if marker else []

    def stop_all(self, timeout: float = 10.0) -> None:
        """SIGTERM every process of the stack, SIGKILL what is left after `timeout` seconds, or at
        once when a second Ctrl-C or SIGTERM comes meanwhile (it never cuts the stop short)."""
        hurry = threading.Event()
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, lambda *_: hurry.set())
        roots = [proc.pid for _name, proc in self.procs if proc.poll() is None]
        tree = sorted({*roots, *descendants(roots), *self._marked()})
        for pid in roots:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
        _signal_all(tree, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not hurry.is_set():
            for _name, proc in self.procs:
                proc.poll()  # reap, so a service that exited is not counted as alive
            if not any(_alive(pid) for pid in tree):
                break
            time.sleep(0.1)
        # what ignored SIGTERM, and anything started meanwhile
        _signal_all(sorted({*(p for p in tree if _alive(p)), *self._marked()}), signal.SIGKILL)
        for _name, proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


def kill_jobs_left_behind(hai_home: Path) -> None:
    """SIGKILL processes whose environment carries this HAI_HOME (jobs the stopped server left)."""
    # Jobs do not inherit HAI_HOME; their notice file lies under it.
    marker, notice = f"HAI_HOME={hai_home}".encode(), f"HAI_PREEMPT_NOTICE={hai_home}/".encode()
    _signal_all(processes_with(lambda v: v == marker or v.startswith(notice)), signal.SIGKILL)
