"""Who a local job runs as and the environment it starts with: nothing of the server's own."""

from __future__ import annotations

import errno
import os
import pwd
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator

from hai_airflow.backends.common.base import Launch, StartError

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


def usable_run_as(run_as: str | None) -> str | None:
    """A `[backend] run_as` option as given; ValueError says why `hai serve` cannot use it."""
    problem = None if run_as is None else run_as_problem(run_as)
    if problem is not None:
        raise ValueError(problem)
    return run_as


RunAs = Annotated[str | None, AfterValidator(usable_run_as)]
"""The type of a backend's `run_as` option."""


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


MKDIR_SECONDS = 30
"""How long creating a job's dir on a (network) file system may take before the start fails."""


def make_dirs_as(user: JobUser | None, path: Path) -> None:
    """Create the dir `path` a user named (and its missing parents) as the job's account, so a swapped
    symlink gains nothing the user could not reach anyway; as the server's own user when jobs run as
    that (`user` None). OSError says why it could not."""
    if user is None:
        path.mkdir(parents=True, exist_ok=True)
        return
    try:
        done = subprocess.run(
            ["mkdir", "-p", "--", str(path)],
            user=user.uid,
            group=user.gid,
            extra_groups=list(user.groups),
            capture_output=True,
            text=True,
            timeout=MKDIR_SECONDS,
            stdin=subprocess.DEVNULL,
            env={"PATH": SYSTEM_PATH, "LANG": "C"},
        )
    except subprocess.TimeoutExpired:
        why = f"no answer from its file system in {MKDIR_SECONDS} s"
        raise OSError(errno.ETIMEDOUT, why, str(path)) from None
    if done.returncode != 0:
        why = done.stderr.strip().removeprefix("mkdir: ") or f"mkdir exit code {done.returncode}"
        raise PermissionError(errno.EACCES, f"{user.name} cannot create it: {why}", str(path))


def job_account(run_as: str | None, launch: Launch, home: Path | None) -> JobUser | None:
    """The account an instance runs as (None: the server's own), with its dirs ready for it: the work
    dir and a model dir the platform made are given to it, a missing model dir the user named is
    made by it. StartError says why the instance cannot start."""
    user: JobUser | None = None
    launch.work_dir.mkdir(parents=True, exist_ok=True)
    model_dir = launch.job.model_dir
    if run_as is not None:
        owner = launch.job.user
        try:
            user = job_user(run_as, owner)
        except KeyError:
            raise StartError(
                f"run_as: there is no OS user for {owner!r} on this machine; "
                "create it or change [backend] run_as"
            ) from None
        # Only dirs the platform made for this job change owner; a model dir elsewhere is the user's.
        made = home is not None and model_dir.is_dir() and model_dir.is_relative_to(home / "jobs")
        mine = [launch.work_dir] + ([model_dir] if made and model_dir != launch.work_dir else [])
        try:
            for d in mine:
                if home is not None:
                    let_through(home, d)
            give_to(user, *mine)
        except OSError as e:
            raise StartError(f"cannot give the job's directories to {user.name}: {e}") from e
    try:
        if not model_dir.is_dir():
            make_dirs_as(user, model_dir)
    except OSError as e:
        raise StartError(f"spec.model_dir {model_dir} cannot be created: {e.strerror or e}") from None
    return user


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
