"""`hai cp N:PATH DEST`: files of a task's model dir downloaded through the API, as kubectl cp does."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated

import typer

from hai_airflow.cli.connection import ServerFlags, connect
from hai_airflow.cli.flags import with_flags
from hai_airflow.cli.output import Column, OutputFlags, emit, note, say, usage_error, when

if TYPE_CHECKING:
    from hai_airflow.client import HaiClient
    from hai_airflow.spec import FileEntryView

MAX_DEPTH = 32
"""How deep a directory copy goes; a deeper tree is not a model dir."""

FILE_COLUMNS = (
    Column("NAME", lambda e: e.name + ("/" if e.kind == "dir" else "")),
    Column("KIND", lambda e: e.kind),
    Column("SIZE", lambda e: e.size if e.kind == "file" else None, "right"),
    Column("MODIFIED", lambda e: when(datetime.fromtimestamp(e.modified, UTC))),
)


def source(text: str) -> tuple[int, str]:
    """`12:checkpoints/last.pt` as (12, "checkpoints/last.pt"); `12:` or `12` is the whole model dir."""
    task, _, path = text.partition(":")
    if not task.isdigit() or int(task) < 1:
        usage_error(f"SOURCE {text!r} names no task: write TASK_ID:PATH, e.g. 12:checkpoints/last.pt")
    return int(task), path


@dataclass
class Copied:
    files: int = 0
    bytes: int = 0


@with_flags()
def cp(
    src: Annotated[
        str, typer.Argument(metavar="TASK_ID:PATH", help="A file or directory in the task's model dir.")
    ],
    dest: Annotated[
        str | None, typer.Argument(metavar="DEST", help="Where to put it; `-` writes a file to stdout.")
    ] = None,
    list_: Annotated[
        bool, typer.Option("--list", "-l", help="List the directory (or show the file) instead of copying.")
    ] = False,
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """Copy a file or directory from a task's model dir (its checkpoints, its final model) to here:
    `hai cp 12:checkpoints/last.pt .`, `hai cp 12: ./run12` (the whole dir), `hai cp 12: -l`. The
    task's owner and its group's admins may, with the rights of the task's own account; links in the
    model dir are never followed, and nothing outside it is reached."""
    task_id, path = source(src)
    if dest is None and not list_:
        usage_error("give DEST (a directory, a file name, or - for stdout), or --list")
    with connect(connection) as client:
        found = client.files(task_id, path)
        if list_:
            rows = found.entries if found.entries is not None else [found]
            emit(rows, FILE_COLUMNS, out=out, empty="the directory is empty", name=lambda e: e.name)
            return
        assert dest is not None
        done = Copied()
        if found.kind == "dir":
            if dest == "-":
                usage_error(f"{src} is a directory: give a directory as DEST, not -")
            target = _into(Path(dest), PurePosixPath(path).name or f"task-{task_id}")
            _copy_dir(client, task_id, path, target, done, 0)
        elif found.kind == "file":
            target = Path("-") if dest == "-" else _into(Path(dest), PurePosixPath(path).name)
            _copy_file(client, task_id, path, target, done)
        else:
            usage_error(f"{src} is a {found.kind}, not a file or directory: hai cp copies no links")
    if dest != "-":
        say(f"copied {done.files} file{'s' if done.files != 1 else ''} ({done.bytes} bytes) to {dest}")


def _into(dest: Path, name: str) -> Path:
    """Where a copy named `name` goes: into DEST when it is a directory, else DEST itself."""
    return dest / name if dest.is_dir() else dest


def _copy_file(client: HaiClient, task_id: int, path: str, target: Path, done: Copied) -> None:
    """Download into a temporary file beside `target`, renamed over it once whole: an interrupted copy
    leaves no half file."""
    if str(target) == "-":
        for chunk in client.download(task_id, path):
            sys.stdout.buffer.write(chunk)
            done.bytes += len(chunk)
        sys.stdout.buffer.flush()
        done.files += 1
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in client.download(task_id, path):
                f.write(chunk)
                done.bytes += len(chunk)
        os.chmod(temp, 0o644 & ~_umask())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    done.files += 1


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _copy_dir(client: HaiClient, task_id: int, path: str, target: Path, done: Copied, depth: int) -> None:
    if depth > MAX_DEPTH:
        note(f"hai: skipped {shown(path)}: deeper than {MAX_DEPTH} directories")
        return
    target.mkdir(parents=True, exist_ok=True)
    listing = client.files(task_id, path)
    if listing.truncated:
        where = shown(path) or "the model dir"
        note(f"hai: {where} holds more entries than the server lists; copied the first")
    for entry in listing.entries or []:
        if not _plain_name(entry):
            note(f"hai: skipped {entry.name!r}: not a plain file name")
            continue
        below = f"{path.rstrip('/')}/{entry.name}" if path.strip("/") else entry.name
        if entry.kind == "dir":
            _copy_dir(client, task_id, below, target / entry.name, done, depth + 1)
        elif entry.kind == "file":
            _copy_file(client, task_id, below, target / entry.name, done)
        else:
            note(f"hai: skipped {shown(below)}: a {entry.kind}, not copied")


def shown(name: str) -> str:
    """A name as the terminal may print it: control characters (CR/LF, escapes) written as `\\r`, `\\x1b`."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


def _plain_name(entry: FileEntryView) -> bool:
    """A name that stays where it is put: no separator, not `.` or `..`."""
    return (
        bool(entry.name)
        and "/" not in entry.name
        and "\0" not in entry.name
        and entry.name not in (".", "..")
    )
