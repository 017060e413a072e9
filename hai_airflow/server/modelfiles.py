"""`hai cp`: a task's model dir listed and its files read, as the task's own account may, confined to it.

The reading is done by a small process of the system's Python running as the job's account (`[backend]
run_as`), so the kernel decides what it may read, with every right and limit of that account (ACLs
too), and root never follows a path a user controls. That process opens the model dir by its path (as
the account would), then walks below it one component at a time without following a link: nothing
outside the model dir is reached, whatever the job put in it. Where jobs run as the server's own
account the process is that account; where that is root, the model dir is opened by the server from
its allowed root (`confine.open_beneath`) and handed over open.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

from hai_airflow.backends.jobuser import SYSTEM_PATH, JobUser

READ_BYTES = 1 << 20
MAX_LISTED = 10_000
"""Entries a listing gives at most; `truncated` says when a directory holds more."""
START_SECONDS = 30.0
"""How long the reader may take to answer (a hung network file system) before the request fails."""

READER = r"""
import json, os, stat, sys
how, top, rel, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
D = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
def fail(kind, what):
    sys.stderr.write(json.dumps({"kind": kind, "what": what}))
    sys.exit(3)
def kind(m):
    return "dir" if stat.S_ISDIR(m) else "file" if stat.S_ISREG(m) else "link" if stat.S_ISLNK(m) else "other"
def entry(name, st):
    return {"name": name, "kind": kind(st.st_mode), "size": st.st_size, "modified": st.st_mtime}
try:
    fd = int(top[3:]) if top.startswith("fd:") else os.open(top, D)
except OSError as e:
    fail("top", e.strerror)
parts = [p for p in rel.split("/") if p not in ("", ".")]
shown = ""
try:
    for name in parts[:-1]:
        shown += name + "/"
        fd = os.open(name, D | os.O_NOFOLLOW, dir_fd=fd)
    name = parts[-1] if parts else "."
    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
except OSError as e:
    why = "missing" if e.errno == 2 else "link" if e.errno in (20, 40) else "denied"
    fail(why, shown + (e.strerror or ""))
if stat.S_ISLNK(st.st_mode):
    fail("link", rel)
if how == "list":
    out = entry(rel, st)
    if stat.S_ISDIR(st.st_mode):
        try:
            d = os.open(name, D | os.O_NOFOLLOW, dir_fd=fd)
            names = sorted(os.listdir(d))
        except OSError as e:
            fail("denied", e.strerror)
        out["entries"], out["truncated"] = [], len(names) > limit
        for n in names[:limit]:
            try:
                n.encode()
                out["entries"].append(entry(n, os.stat(n, dir_fd=d, follow_symlinks=False)))
            except (OSError, UnicodeEncodeError):
                pass
    sys.stdout.write(json.dumps(out))
    sys.exit(0)
if not stat.S_ISREG(st.st_mode):
    fail("notfile", rel)
try:
    f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
except OSError as e:
    fail("link" if e.errno == 40 else "denied", e.strerror)
st = os.fstat(f)
if not stat.S_ISREG(st.st_mode):
    fail("notfile", rel)
if st.st_size > limit:
    fail("big", str(st.st_size))
out = sys.stdout.buffer
out.write(json.dumps({"size": st.st_size}).encode() + b"\n")
left = st.st_size
while left > 0:
    chunk = os.read(f, min(left, 1 << 20))
    if not chunk:
        break
    out.write(chunk)
    left -= len(chunk)
out.flush()
"""


class FileProblem(Exception):
    """The reader refused: `kind` is missing, link, denied, notfile, big or top; `what` its words."""

    def __init__(self, kind: str, what: str):
        super().__init__(what)
        self.kind = kind
        self.what = what


@dataclass(frozen=True)
class Top:
    """Where the model dir is: its path (opened by the reader as the account), or a dir fd the server
    opened from its allowed root for a reader that is root."""

    path: str
    fd: int | None = None

    def argument(self) -> str:
        return self.path if self.fd is None else f"fd:{self.fd}"


def _python() -> str:
    """The system's Python: an account a job runs as may not reach the server's own environment."""
    return shutil.which("python3", path=SYSTEM_PATH) or sys.executable


def _start(how: str, top: Top, rel: str, limit: int, account: JobUser | None) -> subprocess.Popen[bytes]:
    switch = account if account is not None and account.uid != os.geteuid() else None
    return subprocess.Popen(
        [_python(), "-I", "-S", "-c", READER, how, top.argument(), rel, str(limit)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PATH": SYSTEM_PATH, "LANG": "C.UTF-8"},
        cwd="/",
        pass_fds=() if top.fd is None else (top.fd,),
        user=None if switch is None else switch.uid,
        group=None if switch is None else switch.gid,
        extra_groups=None if switch is None else list(switch.groups),
    )


def _refusal(process: subprocess.Popen[bytes], err: bytes) -> FileProblem:
    try:
        said = json.loads(err)
        return FileProblem(str(said["kind"]), str(said["what"]))
    except (ValueError, KeyError, TypeError):
        return FileProblem("denied", f"the reader failed (exit code {process.returncode})")


def listing(top: Top, rel: str, account: JobUser | None) -> dict[str, object]:
    """What `rel` below the model dir is: kind, size, modified, and a directory's entries."""
    process = _start("list", top, rel, MAX_LISTED, account)
    try:
        out, err = process.communicate(timeout=START_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise FileProblem(
            "slow", f"no answer from the model dir's file system in {START_SECONDS:g} s"
        ) from None
    if process.returncode != 0:
        raise _refusal(process, err)
    answer: dict[str, object] = json.loads(out)
    return answer


@dataclass
class Opened:
    """A file being read: its size, then its bytes as they come (`close` ends the reader early)."""

    size: int
    process: subprocess.Popen[bytes]

    def chunks(self) -> Iterator[bytes]:
        assert self.process.stdout is not None
        try:
            # read1: the head line came through the same buffer, which may hold the first bytes
            out = cast(io.BufferedReader, self.process.stdout)
            while chunk := out.read1(READ_BYTES):
                yield chunk
        finally:
            self.close()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


def open_file(top: Top, rel: str, limit: int, account: JobUser | None) -> Opened:
    """The regular file `rel` below the model dir, opened to be read; FileProblem when it may not be."""
    process = _start("read", top, rel, limit, account)
    assert process.stdout is not None and process.stderr is not None
    head = process.stdout.readline()
    if not head:
        process.wait(timeout=START_SECONDS)
        problem = _refusal(process, process.stderr.read())
        process.stdout.close()
        process.stderr.close()
        raise problem
    return Opened(int(json.loads(head)["size"]), process)
