"""Finding a job's newest checkpoint in its model directory: the newest complete file it wrote."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from hai_airflow.backends.common.confine import open_beneath

MAX_DEPTH = 3


@dataclass(frozen=True)
class Checkpoint:
    path: str
    at: float
    """Modification time (POSIX seconds)."""


@dataclass(frozen=True)
class Counted:
    """Which entries of a model dir are progress (`[checkpoints]`)."""

    patterns: Sequence[str]
    """Globs of the file names that count: by default any."""
    ignore: Sequence[str]
    """Globs of the names of files being written (temp names, dotfiles): never progress, nor searched."""
    directories: Sequence[str]
    """Globs of the directory names that are one checkpoint as a whole (`checkpoint-500/`)."""


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch(name, p) for p in patterns)


def _text(name: str) -> bool:
    """Whether a file name is text: a name of bytes that are not UTF-8 (which Python keeps as
    surrogate escapes) cannot be stored or shown, so it is never a checkpoint nor searched below."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def _newer(found: Checkpoint, best: Checkpoint | None) -> bool:
    """Newest by modification time; the greater path breaks a tie, so every scan picks the same."""
    return best is None or found.at > best.at or (found.at == best.at and found.path > best.path)


def newest_checkpoint(model_dir: Path, counted: Counted, beneath: str | None = None) -> Checkpoint | None:
    """The most recently modified complete file the job wrote under `model_dir` (3 levels deep) whose
    name matches `counted.patterns`, or a directory matching `counted.directories` (as a whole).

    A file being written is not progress: a writer that saves atomically writes a temp name or a
    dotfile (`counted.ignore`) and renames it into place, so whatever bears a final name is complete.

    The walk follows no link the user controls: the model dir is opened from `beneath` (its allowed
    root, or the job's own dir; None: the model dir itself is the root) by `open_beneath`, the one
    routine every reader of a model dir uses, with no link followed at any component; every directory
    below it is opened from its parent's fd without following a link, so a dir swapped for a symlink,
    before or during the scan, leads nowhere. A link in the model dir is never a checkpoint.
    """
    try:
        top = open_beneath(beneath or str(model_dir), str(model_dir))
    except OSError:
        return None
    best: Checkpoint | None = None
    stack: list[tuple[int, str, int]] = [(top, str(model_dir), 0)]
    try:
        while stack:
            fd, where, depth = stack.pop()
            try:
                entries = list(os.scandir(fd))
            except OSError:
                entries = []
            for entry in entries:
                found, below = _look_at(entry, where, counted, depth + 1 < MAX_DEPTH)
                if found is not None and _newer(found, best):
                    best = found
                if below:
                    with contextlib.suppress(OSError):  # swapped for a link, or gone: not walked
                        stack.append((_open_dir(entry.name, fd), _path(where, entry), depth + 1))
            os.close(fd)
    finally:
        for fd, _where, _depth in stack:
            os.close(fd)
    return best


def _path(where: str, entry: os.DirEntry[str]) -> str:
    return os.path.join(where, entry.name)


def _look_at(
    entry: os.DirEntry[str], where: str, counted: Counted, descend: bool
) -> tuple[Checkpoint | None, bool]:
    """What one entry is: a checkpoint (a complete regular file, or a checkpoint directory), and
    whether to search below it (any other directory, while not too deep)."""
    if _matches(entry.name, counted.ignore) or not _text(entry.name):
        return None, False
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return None, False
    found = Checkpoint(_path(where, entry), st.st_mtime)
    if entry.is_file(follow_symlinks=False):
        return (found if _matches(entry.name, counted.patterns) else None), False
    if not entry.is_dir(follow_symlinks=False):
        return None, False  # a link, a fifo, a socket: never progress
    if _matches(entry.name, counted.directories):
        return found, False
    return None, descend


def _open_dir(name: str, parent: int) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
