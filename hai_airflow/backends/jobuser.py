"""Who a local job runs as and the environment it starts with: nothing of the server's own."""

from __future__ import annotations

import os
import pwd
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
JOB_LANG = "C.UTF-8"
OWNER_TEMPLATE = "{user}"
"""`run_as = "{user}"`: each job runs as the OS account named like its owner on the platform."""


def default_job_path() -> str:
    """The platform's Python environment first (`python3` finds the training helpers), then the system's."""
    return f"{Path(sys.executable).parent}:{SYSTEM_PATH}"


def base_env(path: str, home: Path, user: str) -> dict[str, str]:
    """What the platform defines for every job besides the HAI_*, rank and GPU variables.

    HOME is the instance's work dir: writable by the job, private to it, and never the server's home.
    """
    return {
        "PATH": path,
        "HOME": str(home),
        "LANG": JOB_LANG,
        "USER": user,
        "LOGNAME": user,
        # Logs are followed live; a job's Python should not hold its output back in a buffer.
        "PYTHONUNBUFFERED": "1",
    }


@dataclass(frozen=True)
class JobUser:
    """The OS account a job's processes run as (`[backend] run_as`)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]


def run_as_problem(run_as: str) -> str | None:
    """Why `hai serve` cannot run jobs as `run_as`, or None when it can."""
    if run_as != OWNER_TEMPLATE:
        try:
            pwd.getpwnam(run_as)
        except KeyError:
            return f"there is no OS user {run_as!r} on this machine; create it or name another"
    if os.geteuid() != 0 and run_as != server_user():
        return "running jobs as another user needs hai serve to run as root"
    return None


def job_user(run_as: str, owner: str) -> JobUser:
    """The account for a job of `owner`; KeyError when it does not exist."""
    name = owner if run_as == OWNER_TEMPLATE else run_as
    entry = pwd.getpwnam(name)
    groups = tuple(os.getgrouplist(name, entry.pw_gid))
    return JobUser(name, entry.pw_uid, entry.pw_gid, groups)


def give_to(user: JobUser, *dirs: Path) -> None:
    """Make `dirs` the job user's own (0700); a symlink is never followed, so nothing else changes owner."""
    for d in dirs:
        if stat.S_ISLNK(d.lstat().st_mode):
            raise PermissionError(f"{d} is a symbolic link")
        os.chown(d, user.uid, user.gid, follow_symlinks=False)
        d.chmod(0o700)


def open_job_log(path: Path) -> int:
    """Open a worker's log for appending, refusing a link or a file the job may have put there first."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(f"{path} is not a log file of the server's own")
    return fd


def let_through(home: Path, target: Path) -> None:
    """Let other accounts traverse (not list) `$HAI_HOME` down to `target`; the store and token stay 0600."""
    if not target.is_relative_to(home):
        return
    for d in [home, *(p for p in target.parents if p.is_relative_to(home) and p != home)]:
        mode = d.stat().st_mode & 0o777
        if not mode & 0o001:
            d.chmod(mode | 0o001)


def server_user() -> str:
    """The name of the OS user `hai serve` runs as (its uid when the system has no name for it)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())
