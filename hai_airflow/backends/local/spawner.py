"""The spawner: one small process that forks a supervisor for each worker the local backend starts.

A supervisor started afresh is a new interpreter: ~17 ms of CPU before it runs a line, more than the
rest of a short job's life in the server. The spawner pays that once. It is started as
`python -I -S spawner.py FD` by the backend and imports only the standard library and the supervisor;
for each request on its socket it forks, and the child becomes the worker's supervisor, set up as
`subprocess.Popen` would have set up a new process: a session of its own, the working directory (the
instance's work dir; the command's own directory is opened and handed over), the log as stdout and
stderr, /dev/null as stdin, and exactly the environment asked for.

The spawner reaps its children at once (SIGCHLD ignored), so the backend watches supervisors as it
watches those adopted after a restart: by pid and start time, the exit file telling how they ended.
It lives as long as its socket: when the backend closes it, or the server dies, it reads the end and
exits; the supervisors it started go on and are adopted by the system, as when the server dies.

A request is one frame (4-byte length, then JSON: the supervisor's argv, env and two directories),
with the log's fd passed alongside; the answer is one frame: the child's pid and start time, or why
it could not start.
"""

from __future__ import annotations

import _signal as signal
import json
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

SPAWNER = Path(__file__)
Supervise = Callable[[list[str], int | None], int]
"""`supervisor.main`: the supervisor's argv and the command's open directory (or None) to its exit code."""
_LENGTH = struct.Struct("!I")
LOCALE_VARIABLES = frozenset({"LANG", "LC_ALL", "LC_CTYPE"})
"""What the spawner's environment keeps of the server's."""
STOP_SECONDS = 5.0
"""How long the spawner may take to exit once its socket is closed before it is killed."""
O_PATH = getattr(os, "O_PATH", os.O_RDONLY)
"""Enough to enter a directory later (Linux); elsewhere it must be readable."""


class Spawner:
    """The backend's end: starts the spawner process when first needed and again if it has died.

    Thread-safe; one request at a time (a fork takes a millisecond).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def spawn(
        self, argv: list[str], env: Mapping[str, str], cwd: str, command_dir: str | None, stdout: int
    ) -> tuple[int, int]:
        """Start a supervisor in `cwd` for a command that runs in `command_dir` (None: the supervisor
        enters it itself); (pid, start time in clock ticks, 0 if it has already ended).

        Raises OSError when the process could not be set up (a directory that is gone), as
        `subprocess.Popen` would, and when the spawner cannot be reached.
        """
        asked = {"argv": argv, "env": dict(env), "cwd": cwd, "command_dir": command_dir}
        request = json.dumps(asked).encode()
        with self._lock:
            sock = self._connected()
            try:
                _send(sock, request, stdout)
            except OSError:
                # It died since the last request, before this one reached it: nothing was started.
                self._stop()
                sock = self._connected()
                _send(sock, request, stdout)
            try:
                answer = _receive(sock)[0]
            except (OSError, EOFError) as exc:
                self._stop()
                raise OSError(f"the spawner ended before it answered ({exc!r})") from None
        reply = json.loads(answer)
        if reply["error"] is not None:
            raise OSError(reply["errno"], reply["error"]) if reply["errno"] else OSError(reply["error"])
        return int(reply["pid"]), int(reply["started"])

    @property
    def pid(self) -> int | None:
        """The spawner process, once started."""
        return None if self._process is None else self._process.pid

    def close(self) -> None:
        """End the spawner (the supervisors it started run on)."""
        with self._lock:
            self._stop()

    def _connected(self) -> socket.socket:
        if self._socket is None:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(SPAWNER), str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    # None of the server's secrets: its environment is what /proc shows for every
                    # supervisor it forks. The locale keeps paths encoded as the server encodes them.
                    env={k: v for k, v in os.environ.items() if k in LOCALE_VARIABLES},
                    # Apart from the terminal: Ctrl-C on `hai serve` is the server's to handle.
                    start_new_session=True,
                )
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            self._socket = ours
        return self._socket

    def _stop(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if self._process is not None:
            try:
                self._process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:  # stuck setting up a child (a hung mount)
                self._process.kill()
                self._process.wait()
            self._process = None


def _send(sock: socket.socket, data: bytes, fd: int | None = None) -> None:
    frame = _LENGTH.pack(len(data)) + data
    sent = socket.send_fds(sock, [frame], [fd]) if fd is not None else sock.send(frame)
    sock.sendall(frame[sent:])


def _receive(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One frame and the fds that came with it; EOFError at the end of the stream."""
    head, fds, _flags, _addr = socket.recv_fds(sock, _LENGTH.size, 1)
    if not head:
        raise EOFError
    head += _read_exactly(sock, _LENGTH.size - len(head))
    return _read_exactly(sock, _LENGTH.unpack(head)[0]), fds


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


# ---- the spawner process ----------------------------------------------------------------------


def serve(sock: socket.socket, supervise: Supervise) -> None:
    """Answer requests until the socket ends; each child runs `supervise(argv, command_dir)` and exits
    with its code."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel, never zombies
    while True:
        try:
            data, fds = _receive(sock)
        except EOFError:
            return
        try:
            (stdout,) = fds
            answer = _fork(sock, json.loads(data), stdout, supervise)
        except OSError as exc:  # no process to fork (EAGAIN), no pipe (EMFILE)
            answer = _failure(exc)
        finally:
            for fd in fds:
                os.close(fd)
        _send(sock, json.dumps(answer).encode())


def _fork(sock: socket.socket, request: dict, stdout: int, supervise: Supervise) -> dict:
    status_r, status_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(status_r)
        sock.close()
        _child(request, stdout, status_w, supervise)
    os.close(status_w)
    # Read at once, while the child is at most setting itself up: it cannot have ended yet.
    started = _start_time(pid)
    try:
        failed = _read_all(status_r)
    finally:
        os.close(status_r)
    if failed:
        errno, _, message = failed.decode(errors="replace").partition(" ")
        return {"pid": pid, "started": 0, "errno": int(errno), "error": message}
    return {"pid": pid, "started": started, "errno": 0, "error": None}


def _failure(exc: OSError) -> dict:
    where = f": {exc.filename!r}" if exc.filename is not None else ""
    return {"pid": 0, "started": 0, "errno": exc.errno or 0, "error": f"{exc.strerror or exc}{where}"}


def _child(request: dict, stdout: int, status: int, supervise: Supervise) -> None:
    """Become the supervisor the request asks for; never returns."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the supervisor waits for its own children
        os.setsid()
        # None: the supervisor enters the command's directory itself, as the job's account
        asked = request["command_dir"]
        command_dir = None if asked is None else os.open(asked, O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        os.chdir(request["cwd"])
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.dup2(stdout, 1)
        os.dup2(stdout, 2)
        os.close(stdin)
        os.close(stdout)
        os.environ.clear()
        os.environ.update(request["env"])
    except Exception as exc:
        answer = _failure(exc) if isinstance(exc, OSError) else {"errno": 0, "error": repr(exc)}
        os.write(status, f"{answer['errno']} {answer['error']}".encode())
        os._exit(127)
    os.close(status)  # an empty status: it started
    code = 1
    try:
        code = supervise(request["argv"], command_dir)
    except BaseException:
        sys.excepthook(*sys.exc_info())  # into the worker's log, as an interpreter of its own would
    finally:
        os._exit(code)


def _read_all(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 4096):
        data += chunk
    return data


def _start_time(pid: int) -> int:
    """/proc/<pid>/stat field 22, as `procs.start_time` reads it; 0 where there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return 0
    return int(raw[raw.rindex(b")") + 2 :].split()[19])


if __name__ == "__main__":
    # -I leaves the script's directory off the path; appended, it cannot shadow the standard library.
    sys.path.append(str(SPAWNER.parent))
    import supervisor

    serve(socket.socket(fileno=int(sys.argv[1])), supervisor.main)
