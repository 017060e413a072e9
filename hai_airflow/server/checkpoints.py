"""Finding a job's newest checkpoint in its model directory."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

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
) -> Checkpoint | None:
    """The most recently modified file (or directory, e.g. `checkpoint-500/`) matching `patterns`.

    Temp files (`ignore`) never count: a writer that saves atomically renames them into place.
    With `written_before`, anything modified later is skipped: after a hard kill a half-written
    file must not replace the last good checkpoint.
    """
    best: Checkpoint | None = None
    stack: list[tuple[Path, int]] = [(model_dir, 0)]
    while stack:
        directory, depth = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if _matches(entry.name, ignore) or not _text(entry.name):
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                mtime = entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            if _matches(entry.name, patterns):
                if written_before is not None and mtime > written_before:
                    continue
                if best is None or mtime > best.at or (mtime == best.at and entry.path > best.path):
                    best = Checkpoint(entry.path, mtime)
            elif is_dir and depth + 1 < MAX_DEPTH:
                stack.append((Path(entry.path), depth + 1))
    return best
