"""The per-worker supervisor: runs the job command, records its exit code, prefixes its combined log."""

# Started as `python -I -S supervisor.py EXIT_FILE COMMAND [COMBINED_LOG PREFIX]` in the worker's own
# process group. It imports only the standard library, so it starts fast and keeps working after the
# server that started it is gone; the exit file is how a restarted server learns the exit code.

from __future__ import annotations

import os
import select
import signal
import sys

SHELL = "/bin/sh"
MAX_PENDING = 64 * 1024
"""A line longer than this goes to the combined log unfinished rather than growing without bound."""


def main(argv: list[str]) -> int:
    exit_file, command = argv[1], argv[2]
    combined = argv[3] if len(argv) > 4 else None
    prefix = argv[4].encode() if combined is not None else b""
    # The group's SIGTERM/SIGINT/SIGHUP are meant for the command; the supervisor lives on to record
    # how it ended. A handler (unlike SIG_IGN) is reset by exec, so the command keeps the defaults.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _ignore)
    pipe = os.pipe() if combined is not None else None
    pid = os.fork()
    if pid == 0:
        _exec_command(command, pipe)
    if pipe is None or combined is None:
        _, status = os.waitpid(pid, 0)
    else:
        os.close(pipe[1])
        status = _pump(pid, pipe[0], combined, prefix)
    code = os.waitstatus_to_exitcode(status)
    _write_atomically(exit_file, f"{code}\n")
    return code if code >= 0 else 128 - code


def _ignore(signum: int, frame: object) -> None:
    pass


def _exec_command(command: str, pipe: tuple[int, int] | None) -> None:
    try:
        # Python ignores SIGPIPE and SIGXFSZ; a shell command expects the defaults.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        if pipe is not None:
            os.dup2(pipe[1], 1)
            os.dup2(pipe[1], 2)
            os.close(pipe[0])
            os.close(pipe[1])
        os.execv(SHELL, [SHELL, "-c", command])
    finally:
        os._exit(127)


def _pump(pid: int, fd: int, combined_path: str, prefix: bytes) -> int:
    """Copy the command's output to our stdout (the worker log) and, line by line, to the combined log."""
    combined = os.open(combined_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pending = b""
    status: int | None = None
    while True:
        # Once the command has exited, only drain what is already there: a background process it left
        # behind may hold the pipe open forever.
        ready = select.select([fd], [], [], 0.2 if status is None else 0)[0]
        if ready:
            data = os.read(fd, 65536)
            if not data:
                break
            _write_all(1, data)
            lines, pending = _split_lines(pending + data)
            if lines:
                _write_all(combined, b"".join(prefix + line for line in lines))
        if status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
        if status is not None and not ready:
            break
    if pending:
        _write_all(combined, prefix + pending + b"\n")
    if status is None:
        _, status = os.waitpid(pid, 0)
    return status


def _split_lines(buf: bytes) -> tuple[list[bytes], bytes]:
    """Complete lines (with their newline) and the unfinished rest."""
    head, sep, rest = buf.rpartition(b"\n")
    if not sep:
        return ([rest + b"\n"], b"") if len(rest) > MAX_PENDING else ([], rest)
    return [line + b"\n" for line in head.split(b"\n")], rest


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
