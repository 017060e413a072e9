"""The model dir a requeued job takes over: the old job's files, hard-linked into a dir of its own.

`hai requeue N` runs an ended job again as a new job, whose first instance resumes from N's latest
checkpoint. A job that loads its own checkpoint from `$HAI_MODEL_DIR` must find it there, so the
files of N's model dir are carried over into the new job's model dir before its first start.

They are hard links, not a shared dir and not copies: no data is copied (instant for checkpoints of
any size, and no bytes added to the disk), the old task keeps its files as it ended for `hai cp`,
and the two tasks never share a directory. A job that saves atomically (a temporary name, then
`os.replace`) replaces its own link and never changes the old task's file; one that rewrites a file
in place rewrites both names of it.

Only a model dir the platform made (inside a job's own dir) is carried over; a model dir the user
named is the same path for the new job already. The old dir is walked as every reader of a model
dir walks it, from the old job's own dir without following a link (`confine.open_beneath`); only
regular files and directories are carried, at most MAX_ENTRIES of them, into a temporary dir that is
renamed into place once complete, so the job sees all of the files or none.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from dataclasses import dataclass, replace
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from hai_airflow.backends.common.confine import make_beneath, open_beneath
from hai_airflow.server.control.admission import NewInstance, traverse_only
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.store.tables import InstanceRow

MAX_ENTRIES = 10_000
"""Files and dirs carried over at most; a model dir holding more is not carried over."""
MAX_DEPTH = 16
"""Dir levels below the model dir carried over at most."""

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class NotCarried(Exception):
    """Why a model dir was not carried over, in the user's words."""


@dataclass(frozen=True)
class Carry:
    """A requeued job's first instance and the old job's model dir it takes over."""

    old_job: int
    old_root: str
    """The old job's own dir, which the old model dir is opened from."""
    old_dir: str
    new_root: str
    new_dir: str

    def moved(self, path: str) -> str:
        """`path` (in the old model dir) as it lies in the new one."""
        return os.path.join(self.new_dir, os.path.relpath(path, self.old_dir))


def planned(s: Session, ctx: ServerContext, new: NewInstance) -> Carry | None:
    """What `new` carries over: for the first instance of a requeued job that resumes from the old
    job's checkpoint, the old job's model dir when the platform made it; None otherwise."""
    old_job, checkpoint = new.requeued_from, new.job.latest_checkpoint
    if old_job is None or not new.first_run or checkpoint is None:
        return None
    old_dir = s.scalar(
        select(InstanceRow.model_dir)
        .where(InstanceRow.job_id == old_job, InstanceRow.model_dir.is_not(None))
        .order_by(InstanceRow.id.desc())
        .limit(1)
    )
    old_root, new_root = ctx.jobs_dir(old_job), ctx.jobs_dir(new.job_id)
    new_dir = new.job.model_dir
    if old_dir is None or not (Path(old_dir).is_relative_to(old_root) and new_dir.is_relative_to(new_root)):
        return None
    if not Path(checkpoint).is_relative_to(old_dir):
        return None
    return Carry(old_job, str(old_root), old_dir, str(new_root), str(new_dir))


def carry_over(ctx: ServerContext, carry: Carry) -> int:
    """Link the old model dir's files into the new one (which must not exist yet): the number of
    files carried. Raises NotCarried saying why, leaving the new model dir absent."""
    new_dir = Path(carry.new_dir)
    traverse_only(ctx.home / "jobs")
    traverse_only(Path(carry.new_root))
    try:
        make_beneath(carry.new_root, str(new_dir.parent))
        src = open_beneath(carry.old_root, carry.old_dir)
    except OSError as e:
        raise NotCarried(f"it cannot be opened ({e.strerror or e})") from None
    parent = os.open(new_dir.parent, _DIR)
    try:
        return _staged(src, parent, new_dir.name)
    except OSError as e:
        raise NotCarried(f"{e.strerror or e}") from None
    finally:
        os.close(src)
        os.close(parent)


def _staged(src: int, parent: int, name: str) -> int:
    """Link the tree of `src` into a staging dir in `parent`, renamed to `name` once complete and
    removed when not: the job sees all of the files or none."""
    staging = f".{name}.carrying"
    _make_like(staging, parent, os.fstat(src))
    try:
        files = _link_tree(src, os.open(staging, _DIR, dir_fd=parent), [0], 0)
        os.rename(staging, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging, dir_fd=parent)
        raise
    return files


def _make_like(name: str, parent: int, like: os.stat_result) -> None:
    """Make the dir `name` in `parent` with the mode and (as root) the owner of the dir `like`."""
    os.mkdir(name, stat.S_IMODE(like.st_mode) | stat.S_IRWXU, dir_fd=parent)
    if os.geteuid() == 0:
        os.chown(name, like.st_uid, like.st_gid, dir_fd=parent, follow_symlinks=False)


def _link_tree(src: int, dst: int, seen: list[int], depth: int) -> int:
    """Hard-link the regular files below the dir `src` into `dst`, making its dirs alike; closes
    `dst`. Links, sockets and devices are left behind. `seen` counts the entries carried so far."""
    files = 0
    try:
        for entry in os.scandir(src):
            seen[0] += 1
            if seen[0] > MAX_ENTRIES:
                raise NotCarried(f"it holds more than {MAX_ENTRIES} files and dirs")
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(info.st_mode):
                os.link(entry.name, entry.name, src_dir_fd=src, dst_dir_fd=dst, follow_symlinks=False)
                files += 1
            elif stat.S_ISDIR(info.st_mode) and depth + 1 < MAX_DEPTH:
                below = os.open(entry.name, _DIR, dir_fd=src)
                try:
                    _make_like(entry.name, dst, info)
                    files += _link_tree(below, os.open(entry.name, _DIR, dir_fd=dst), seen, depth + 1)
                finally:
                    os.close(below)
    finally:
        os.close(dst)
    return files


def carried_over(
    ctx: ServerContext, news: list[NewInstance]
) -> tuple[list[NewInstance], dict[int, list[str]]]:
    """The wave's instances, a requeued job's first one resuming from the checkpoint carried over into
    its own model dir; and a note per instance id that carried (or failed to carry) files over."""
    firsts = [n for n in news if n.requeued_from is not None and n.first_run]
    if not firsts:
        return news, {}
    with ctx.store.read() as s:
        plans = {n.instance_id: planned(s, ctx, n) for n in firsts}
    notes: dict[int, list[str]] = {}
    done = []
    for new in news:
        plan = plans.get(new.instance_id)
        if plan is not None:
            new, note = _resumed_in_own_dir(ctx, new, plan)
            notes[new.instance_id] = [note]
        done.append(new)
    return done, notes


def _resumed_in_own_dir(ctx: ServerContext, new: NewInstance, plan: Carry) -> tuple[NewInstance, str]:
    """`new` resuming from its checkpoint as carried over into its own model dir, and the note; as it
    was (resuming from the old job's dir) when the files could not be carried."""
    try:
        files = carry_over(ctx, plan)
    except NotCarried as e:
        why = f"task {plan.old_job}'s model dir was not carried over: {e}"
        return new, f"{why}; it resumes from the checkpoint there (HAI_LATEST_CHECKPOINT)"
    moved = plan.moved(new.job.latest_checkpoint or "")
    note = f"{files} files of task {plan.old_job}'s model dir carried over into {plan.new_dir} (hard links)"
    return replace(new, job=replace(new.job, latest_checkpoint=moved), carried_checkpoint=moved), note
