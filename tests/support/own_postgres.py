"""A PostgreSQL server of a test's own (initdb and pg_ctl of the machine's binaries, in a temporary
directory, on a free loopback port): a fault test stops and starts it, never the machine's service
that CI and the other tests share."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
from pathlib import Path

ACCOUNT = "postgres"
"""PostgreSQL refuses to run as root: its data dir and processes belong to this OS account."""


def binaries() -> Path | None:
    """The newest installed PostgreSQL's bin dir, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def unavailable_reason() -> str | None:
    if binaries() is None:
        return "no PostgreSQL binaries under /usr/lib/postgresql (apt install postgresql)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "runuser is missing: PostgreSQL cannot be started as another account"
    try:
        import pwd

        pwd.getpwnam(ACCOUNT)
    except KeyError:
        return f"there is no OS account {ACCOUNT!r} to run PostgreSQL as"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnPostgres:
    """One server: `start()`, `stop()` (fast shutdown: every connection is cut), `url`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.port = _free_port()
        self.bin = binaries()
        assert self.bin is not None, unavailable_reason()
        root.mkdir(parents=True, exist_ok=True)
        shutil.chown(root, ACCOUNT)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str, check: bool = True) -> None:
        assert self.bin is not None
        argv = [str(self.bin / tool), *args]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", ACCOUNT, "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=self.root)
        assert done.returncode == 0 or not check, f"{tool} failed: {done.stdout}{done.stderr}"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def close(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)
