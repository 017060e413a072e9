"""`hai cp`: a task's model dir listed and its files read, as the task's own account may, confined to it.

The server opens the model dir once, from the allowed root that holds it, following no link at any
component (`confine.open_beneath`, the routine every reader of a model dir goes through), in a small
pool of its own threads. A small process of the system's Python, running as the job's account
(`[backend] run_as`), is handed that fd and opens it again as itself, so the kernel decides what it may
read with every right and limit of that account (ACLs too); below it, it walks one component at a time
without following a link. Root never follows a path a user controls, and a group share's admin who
swaps a member's model dir for a link to another of the member's dirs gains nothing.

The reader's output is read by the event loop with timeouts, never by a thread of the pool that
serves other requests: a reader its job stops (it runs as the same account, so the job may SIGSTOP
it), or one stuck on a hung file system, is killed and the request ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import IO, TypeVar

from hai_airflow.backends.common.jobuser import SYSTEM_PATH, JobUser

T = TypeVar("T")

READ_BYTES = 1 << 20
MAX_LISTED = 10_000
"""Entries a listing gives at most; `truncated` says when a directory holds more."""
START_SECONDS = 30.0
"""How long opening the model dir and the reader's first answer may take (a hung network file
system) before the request fails."""
STALL_SECONDS = 30.0
"""How long a file being sent may give no bytes before its reader is killed and the answer cut."""
WATCH_SECONDS = 0.5
"""How often a reader that is waited for is looked at: one stopped by a signal is killed at once."""
REAP_SECONDS = 5.0
"""How long a killed reader is waited for (one in a hung file system's wait may not die at once)."""
OPEN_THREADS = 8
"""Threads that open model dirs for `hai cp`: a hung file system holds these, never the API's pool."""

_OPENING = concurrent.futures.ThreadPoolExecutor(OPEN_THREADS, thread_name_prefix="hai-cp-open")

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
    # the server's fd, opened again as this account: its own rights decide, for the model dir too
    fd = os.open(".", D, dir_fd=int(top))
    os.close(int(top))
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
    """The reader refused: `kind` is missing, link, denied, notfile, big, top, swapped, slow or stopped;
    `what` its words."""

    def __init__(self, kind: str, what: str):
        super().__init__(what)
        self.kind = kind
        self.what = what


async def opened_apart(opening: Callable[[], int]) -> int:
    """The fd `opening` returns, run in the cp threads, not the API's pool; FileProblem("slow") when it
    takes more than START_SECONDS (the fd it returns later is closed)."""
    future = asyncio.get_running_loop().run_in_executor(_OPENING, opening)
    try:
        return await asyncio.wait_for(asyncio.shield(future), START_SECONDS)
    except TimeoutError:
        future.add_done_callback(_close_late)
        raise FileProblem("slow", f"the model dir did not open in {START_SECONDS:g} s") from None
    except asyncio.CancelledError:  # the client left while it opened
        future.add_done_callback(_close_late)
        raise


def _close_late(future: asyncio.Future[int]) -> None:
    if not future.cancelled() and future.exception() is None:
        with contextlib.suppress(OSError):
            os.close(future.result())


def _python() -> str:
    """The system's Python: an account a job runs as may not reach the server's own environment."""
    return shutil.which("python3", path=SYSTEM_PATH) or sys.executable


def stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal or a tracer (its job may SIGSTOP it): it will not
    answer until someone continues it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in (b"T", b"t")


@dataclass
class Reader:
    """A running reader process; its output read by the event loop, never by a thread."""

    process: subprocess.Popen[bytes]
    out: asyncio.StreamReader
    err: asyncio.StreamReader
    transports: list[asyncio.BaseTransport] = field(default_factory=list)

    async def watched(self, step: Awaitable[T], seconds: float) -> T:
        """`step` (a read of the reader's output); when the reader is stopped, or nothing comes for
        `seconds`, the reader is killed and FileProblem ("stopped", "slow") raised."""
        task = asyncio.ensure_future(step)
        deadline = asyncio.get_running_loop().time() + seconds
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=WATCH_SECONDS)
                if task.done():
                    break
                if stopped(self.process.pid):
                    raise FileProblem("stopped", "the reader of the model dir was stopped (SIGSTOP)")
                if asyncio.get_running_loop().time() >= deadline:
                    raise FileProblem("slow", f"no answer from the model dir's file system in {seconds:g} s")
            return task.result()
        finally:
            if not task.done():
                task.cancel()
                self.process.kill()

    async def everything(self, stream: asyncio.StreamReader) -> bytes:
        """All the reader writes to `stream`, within START_SECONDS."""
        return await self.watched(stream.read(), START_SECONDS)

    async def exit_code(self) -> int:
        """The reader's exit code once it has ended, within START_SECONDS."""
        return await self.watched(self._exited(), START_SECONDS)

    async def _exited(self) -> int:
        while (code := self.process.poll()) is None:
            await asyncio.sleep(0.01)
        return code

    async def refusal(self) -> FileProblem:
        """What the reader said when it refused."""
        err = await self.everything(self.err)
        try:
            said = json.loads(err)
            return FileProblem(str(said["kind"]), str(said["what"]))
        except (ValueError, KeyError, TypeError):
            return FileProblem("denied", f"the reader failed (exit code {self.process.returncode})")

    async def end(self) -> None:
        """Kill the reader if it still runs, reap it (for at most REAP_SECONDS) and close its pipes."""
        if self.process.poll() is None:
            self.process.kill()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._exited(), REAP_SECONDS)
        for transport in self.transports:
            transport.close()


async def _pipe(pipe: IO[bytes] | None, transports: list[asyncio.BaseTransport]) -> asyncio.StreamReader:
    assert pipe is not None
    loop = asyncio.get_running_loop()
    stream = asyncio.StreamReader(limit=2 * READ_BYTES, loop=loop)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stream, loop=loop), pipe)
    transports.append(transport)
    return stream


async def start(how: str, top: int, rel: str, limit: int, account: JobUser | None) -> Reader:
    """A reader of `rel` below the model dir open as `top` (an fd the reader takes over: the caller
    closes its own copy), as `account` (None: the server's own)."""
    switch = account if account is not None and account.uid != os.geteuid() else None
    process = subprocess.Popen(
        [_python(), "-I", "-S", "-c", READER, how, str(top), rel, str(limit)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PATH": SYSTEM_PATH, "LANG": "C.UTF-8"},
        cwd="/",
        pass_fds=(top,),
        user=None if switch is None else switch.uid,
        group=None if switch is None else switch.gid,
        extra_groups=None if switch is None else list(switch.groups),
    )
    transports: list[asyncio.BaseTransport] = []
    try:
        out = await _pipe(process.stdout, transports)
        err = await _pipe(process.stderr, transports)
    except BaseException:
        await Reader(process, asyncio.StreamReader(), asyncio.StreamReader(), transports).end()
        raise
    return Reader(process, out, err, transports)


async def listing(top: int, rel: str, account: JobUser | None) -> dict[str, object]:
    """What `rel` below the model dir is: kind, size, modified, and a directory's entries."""
    reader = await start("list", top, rel, MAX_LISTED, account)
    try:
        out = await reader.everything(reader.out)
        if await reader.exit_code() != 0:
            raise await reader.refusal()
        answer: dict[str, object] = json.loads(out)
        return answer
    finally:
        await reader.end()


@dataclass
class Opened:
    """A file being read: its size, then its bytes as they come (`close` ends the reader early)."""

    size: int
    reader: Reader

    async def chunks(self) -> AsyncIterator[bytes]:
        """The file's bytes; FileProblem when the reader stalls or is stopped on the way."""
        left = self.size
        while left > 0:
            chunk = await self.reader.watched(self.reader.out.read(min(left, READ_BYTES)), STALL_SECONDS)
            if not chunk:
                raise FileProblem("short", f"the reader ended with {left} of {self.size} bytes unsent")
            left -= len(chunk)
            yield chunk

    async def close(self) -> None:
        await self.reader.end()


async def open_file(top: int, rel: str, limit: int, account: JobUser | None) -> Opened:
    """The regular file `rel` below the model dir, opened to be read; FileProblem when it may not be."""
    reader = await start("read", top, rel, limit, account)
    try:
        head = await reader.watched(reader.out.readline(), START_SECONDS)
        if not head:
            await reader.exit_code()
            raise await reader.refusal()
        return Opened(int(json.loads(head)["size"]), reader)
    except BaseException:
        await reader.end()
        raise
