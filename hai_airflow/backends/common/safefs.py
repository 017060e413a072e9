"""Files in job-writable directories, opened and written without following a link a job planted there."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePath

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_ATTEMPTS = 8


class UnsafeFile(OSError):
    """A path the server refuses to use: a link, not a regular file, or not below its trusted root."""


def trusted_root(path: Path, home: Path | None) -> Path:
    """Where the walk to an instance's file starts: `$HAI_HOME/jobs` when it holds the file, else the
    instance dir's parent.

    Jobs may write their instance dir (it is mounted into containers) and their job dir (the default
    model dir lives there), never `$HAI_HOME/jobs` itself; everything below the root is walked with
    O_NOFOLLOW. The root itself is followed: it is the administrator's to place, links included.
    """
    if home is not None:
        jobs = home / "jobs"
        if path.is_relative_to(jobs) and path != jobs:
            return jobs
    return path.parent.parent


def _parts_below(root: Path, path: Path) -> tuple[str, ...]:
    """The components of `path` below `root`; UnsafeFile when it is not below it or climbs with '..'."""
    try:
        parts = PurePath(path).relative_to(root).parts
    except ValueError:
        raise UnsafeFile(errno.EACCES, f"{path} is not below {root}") from None
    if not parts or ".." in parts:
        raise UnsafeFile(errno.EACCES, f"{path} is not a file below {root}")
    return parts


def _refusal(exc: OSError, shown: PurePath, what: str = "what the server created") -> UnsafeFile:
    """The UnsafeFile for an open that O_NOFOLLOW (or O_DIRECTORY) refused."""
    return UnsafeFile(exc.errno, f"{shown} is a symbolic link or not {what}")


def open_dir_below(root: Path, names: Sequence[str], create: bool = False) -> int:
    """A directory fd of `root`/`names`, reached from `root` one component at a time without links.

    `root` is the administrator's and is opened as it is; each name below it is opened from its
    parent's fd with O_NOFOLLOW, so a component swapped for a symlink, whenever the swap happens,
    refuses the walk (UnsafeFile, naming the component) instead of leading anywhere. `create` makes
    missing directories on the way (mkdir never follows a link at its last component).
    """
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    shown = PurePath(root)
    try:
        for name in names:
            shown = shown / name
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refusal(exc, shown, "a directory: links are not followed") from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(root: Path, path: Path) -> int:
    """A read-only fd of the regular file `path`, found below `root` without following any link.

    FileNotFoundError while it does not exist; UnsafeFile for a link, a FIFO or device (which could
    block the reader or reach another file), or a second hard link to the file (one a job made to a
    file it could not read itself).
    """
    parts = _parts_below(root, path)
    parent = open_dir_below(root, parts[:-1])
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refusal(exc, path) from None
        raise
    finally:
        os.close(parent)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        what = "has more than one hard link" if stat.S_ISREG(info.st_mode) else "is not a regular file"
        raise UnsafeFile(errno.EACCES, f"{path} {what}")
    return fd


def write_below(root: Path, path: Path, data: bytes | Iterable[bytes], mode: int = 0o644) -> None:
    """Replace `path` below `root` with `data` (bytes, or pieces written as they come) atomically,
    never writing through a link.

    The bytes go to a new file (O_CREAT|O_EXCL|O_NOFOLLOW, a random name) in the parent reached
    without links, which is then renamed over `path`: a link planted at `path` is replaced, not
    followed, and a reader never sees half a file. Missing directories below `root` are created.
    """
    parts = _parts_below(root, path)
    parent = open_dir_below(root, parts[:-1], create=True)
    try:
        temp, fd = _create_temp(parent, parts[-1], mode)
        try:
            with os.fdopen(fd, "wb") as f:
                for piece in [data] if isinstance(data, bytes) else data:
                    f.write(piece)
            os.replace(temp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=parent)
            raise
    finally:
        os.close(parent)


def _create_temp(parent: int, name: str, mode: int) -> tuple[str, int]:
    """A fresh file beside `name`; a name a job guessed and took first is skipped, never reused."""
    for _ in range(_TEMP_ATTEMPTS):
        temp = f".{name}.{secrets.token_hex(8)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with contextlib.suppress(FileExistsError):
            return temp, os.open(temp, flags, mode, dir_fd=parent)
    raise UnsafeFile(errno.EEXIST, f"no temporary file could be created beside {name}")
