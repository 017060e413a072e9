"""Process facts from /proc and process-group signals, safe against pid reuse."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from hai_airflow.backends.common.safefs import open_regular, trusted_root

PROC = Path("/proc")
EXIT_FILE_BYTES = 32
"""More than an exit code ever needs: a longer exit file is not the supervisor's."""


def start_time(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (/proc/<pid>/stat field 22); None if gone."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def is_alive(pid: int, started: int) -> bool:
    """True if `pid` runs (not a zombie) and is the process that started at `started`, not a reused pid."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X") and int(fields[19]) == started


def running() -> list[int]:
    """Pids of the processes now in /proc (some may be gone by the time they are looked at)."""
    return [int(entry.name) for entry in PROC.iterdir() if entry.name.isdigit()]


def cmdline(pid: int) -> list[str] | None:
    """The argument vector of a process; None if it is gone, [] for a zombie."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return [arg.decode(errors="surrogateescape") for arg in raw.split(b"\0")[:-1]]


def cwd(pid: int) -> Path | None:
    """The working directory of a process, resolved; None if it is gone or not ours to read."""
    try:
        return Path(os.readlink(PROC / str(pid) / "cwd"))
    except OSError:
        return None


def owner(pid: int) -> int | None:
    """The uid that owns a process; None if it is gone."""
    try:
        return (PROC / str(pid)).stat().st_uid
    except OSError:
        return None


def group_of(pid: int) -> int | None:
    """The process group of a process (/proc/<pid>/stat field 5); None if gone."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[2])


def group_is_alive(pgid: int) -> bool:
    """True while some process of the group runs (zombies do not count)."""
    for pid in running():
        fields = _stat_fields(pid)
        if fields is not None and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            return True
    return False


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send `sig` to every process of the group; a group that is already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def read_exit_file(path: Path) -> int | None:
    """The exit code the supervisor wrote, or None when there is none (yet) or it is not a plain file.

    It lies in the job's work dir: opened without links and read only as far as an exit code goes, a
    FIFO, a link to /dev/zero or a huge file put in its place cannot stall or swell the watcher.
    """
    try:
        fd = open_regular(trusted_root(path, None), path)
    except OSError:
        return None
    try:
        data = os.read(fd, EXIT_FILE_BYTES + 1)
        return int(data.strip()) if len(data) <= EXIT_FILE_BYTES else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses; everything after the last ")" is fixed.
    return raw[raw.rindex(")") + 2 :].split()
