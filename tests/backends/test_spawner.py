"""The spawner: supervisors forked from one long-lived process, each set up as a new process would be."""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hai_airflow.backends.common import procs
from hai_airflow.backends.local.backend import SUPERVISOR
from hai_airflow.backends.local.spawner import Spawner


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {timeout}s"
        time.sleep(0.02)


@pytest.fixture()
def spawner(monkeypatch: pytest.MonkeyPatch) -> Iterator[Spawner]:
    # What the server's environment holds must never reach a supervisor or a job.
    monkeypatch.setenv("HAI_SERVER_SECRET", "not-for-jobs")
    s = Spawner()
    yield s
    s.close()


class Worker:
    """One supervisor started through the spawner, with its work dir, code dir and log."""

    def __init__(self, spawner: Spawner, tmp: Path, command: str, env: dict[str, str] | None = None) -> None:
        self.work = tmp / "work"
        self.code = tmp / "code"
        self.work.mkdir(exist_ok=True)
        self.code.mkdir(exist_ok=True)
        self.exit_file = self.work / "worker0.exit"
        self.log = tmp / "worker.log"
        out = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            self.pid, self.started = spawner.spawn(
                [str(SUPERVISOR), str(self.exit_file), command],
                env or {"PATH": os.environ["PATH"]},
                str(self.work),
                str(self.code),
                out,
            )
        finally:
            os.close(out)

    def exit_code(self, timeout: float = 5) -> int:
        wait_until(self.exit_file.exists, "the exit file", timeout)
        return int(self.exit_file.read_text())


def test_a_supervisor_runs_in_a_session_of_its_own_with_only_the_environment_asked_for(
    spawner: Spawner, tmp_path: Path
) -> None:
    command = 'echo "pwd=$PWD stdin=$(cat)"; env > env.txt; while [ ! -e go ]; do sleep 0.02; done; exit 3'
    w = Worker(spawner, tmp_path, command, {"PATH": os.environ["PATH"], "ASKED": "yes"})
    assert w.started == procs.start_time(w.pid)
    wait_until(lambda: (w.code / "env.txt").exists(), "the command's env.txt")
    # Its own session and group; it waits in the work dir while the command runs in the code dir.
    assert os.getsid(w.pid) == w.pid and os.getpgid(w.pid) == w.pid
    assert procs.cwd(w.pid) == w.work.resolve()
    (w.code / "go").touch()
    assert w.exit_code() == 3
    assert w.log.read_text().splitlines() == [f"pwd={w.code} stdin="]
    names = {line.partition("=")[0] for line in (w.code / "env.txt").read_text().splitlines()}
    assert "ASKED" in names and "HAI_SERVER_SECRET" not in names
    assert names <= {"ASKED", "PATH", "PWD", "OLDPWD", "SHLVL", "_"}


def test_what_proc_shows_of_a_supervisor_holds_none_of_the_servers_environment(
    spawner: Spawner, tmp_path: Path
) -> None:
    w = Worker(spawner, tmp_path, "sleep 30")
    try:
        environ = Path(f"/proc/{w.pid}/environ").read_bytes()
        assert b"HAI_SERVER_SECRET" not in environ
        assert b"HAI_SERVER_SECRET" not in Path(f"/proc/{spawner.pid}/environ").read_bytes()
    finally:
        os.killpg(w.pid, signal.SIGKILL)


def test_an_ended_supervisor_is_reaped_at_once(spawner: Spawner, tmp_path: Path) -> None:
    w = Worker(spawner, tmp_path, "exit 0")
    assert w.exit_code() == 0
    # Neither running nor a zombie waiting for a parent that never asks.
    wait_until(lambda: procs.start_time(w.pid) != w.started, "the supervisor's /proc entry to go")


def test_a_working_directory_that_is_gone_is_an_error_and_starts_nothing(
    spawner: Spawner, tmp_path: Path
) -> None:
    out = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError) as refused:
            argv = [str(SUPERVISOR), str(tmp_path / "x.exit"), "true"]
            spawner.spawn(argv, {}, str(tmp_path), str(tmp_path / "gone"), out)
    finally:
        os.close(out)
    assert refused.value.errno == errno.ENOENT
    assert str(tmp_path / "gone") in str(refused.value)
    assert not (tmp_path / "x.exit").exists()
    # The spawner itself carries on.
    assert Worker(spawner, tmp_path, "exit 4").exit_code() == 4


def test_a_spawner_that_died_is_started_again_for_the_next_worker(spawner: Spawner, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert Worker(spawner, tmp_path / "a", "true").exit_code() == 0
    first = spawner.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: not procs.is_alive(first, procs.start_time(first) or 0), "the spawner to die")
    assert Worker(spawner, tmp_path / "b", "exit 5").exit_code() == 5
    assert spawner.pid not in (None, first)


def test_closing_the_spawner_leaves_its_supervisors_running(spawner: Spawner, tmp_path: Path) -> None:
    w = Worker(spawner, tmp_path, "while [ ! -e go ]; do sleep 0.02; done; exit 7")
    gone = spawner.pid
    assert gone is not None
    spawner.close()
    assert procs.start_time(gone) is None  # waited for: neither running nor a zombie
    assert procs.is_alive(w.pid, w.started)
    (w.code / "go").touch()
    assert w.exit_code() == 7
