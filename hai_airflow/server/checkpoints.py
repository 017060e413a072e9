"""Finding a job's newest checkpoint in its model directory."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from hai_airflow.backends.confine import open_beneath

MAX_DEPTH = 3


@dataclass(frozen=True)
class Checkpoint:
    path: str
    at: float
    """Modification time (POSIX seconds)."""


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


def newest_checkpoint(
    model_dir: Path,
    patterns: Sequence[str],
    ignore: Sequence[str],
    written_before: float | None = None,
    beneath: str | None = None,
) -> Checkpoint | None:
    """The most recently modified file (or directory, e.g. `checkpoint-500/`) matching `patterns`.

    Temp files (`ignore`) never count: a writer that saves atomically renames them into place.
    With `written_before`, anything modified later is skipped: after a hard kill a half-written
    file must not replace the last good checkpoint.

    The walk follows no link the user controls: the model dir is opened from `beneath` (its allowed
    root, or the job's own dir; None: the model dir itself is the root) by `open_beneath`, the one
    routine every reader of a model dir uses, with no link followed at any component; every directory
    below it is opened from its parent's fd without following a link, so a dir swapped for a symlink,
    before or during the scan, leads nowhere.
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
                os.close(fd)
                continue
            for entry in entries:
                if _matches(entry.name, ignore) or not _text(entry.name):
                    continue
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                    mtime = entry.stat(follow_symlinks=False).st_mtime
                except OSError:
                    continue
                path = os.path.join(where, entry.name)
                if _matches(entry.name, patterns):
                    if written_before is not None and mtime > written_before:
                        continue
                    if best is None or mtime > best.at or (mtime == best.at and path > best.path):
                        best = Checkpoint(path, mtime)
                elif is_dir and depth + 1 < MAX_DEPTH:
                    with contextlib.suppress(OSError):  # swapped for a link, or gone: not walked
                        stack.append((_open_dir(entry.name, fd), path, depth + 1))
            os.close(fd)
    finally:
        for fd, _where, _depth in stack:
            os.close(fd)
    return best


def _open_dir(name: str, parent: int) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
