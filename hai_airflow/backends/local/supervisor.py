"""The per-worker supervisor: runs the job command, records its exit code, prefixes its combined log."""

# Runs as `main([supervisor.py, EXIT_FILE, COMMAND, [COMBINED_LOG, PREFIX]])` in a child the spawner
# forks (`spawner.py`), in the worker's own session and process group. It needs only the standard
# library, and keeps working after the server that started it is gone; the exit file is how a
# restarted server learns the exit code.
#
# SIGTERM to the group reaches the shell too, and a non-interactive shell dies of it at once, while the
# command it was waiting for (`python3 train.py`, `cd x && python3 train.py`) may handle it: save a
# checkpoint, then exit 75. So the supervisor is a child subreaper: when the shell died of a signal, the
# processes it leaves behind become the supervisor's children, and it waits for them all before it
# reports, with the exit code one of them chose. A shell trap cannot do this without races: a signal
# that comes between two commands would look like a clean exit, and one that comes while the shell
# forks a command is lost in the child.
#
# A process that left the job's group and session (`setsid cmd &`) is still below the supervisor in
# the process tree: a subreaper adopts every orphan of its descendants. So before it reports, the
# supervisor kills whatever is still below it, and `kill_tree` (used by the backend) does the same
# from outside while the supervisor is alive.
#
# With `[backend] run_as`, the supervisor stays the server's user (root) and only the command drops to
# the job's account ($HAI_RUN_AS = "uid:gid:group,group..."): the job cannot signal, trace or stop the
# process that records how it ended, and the supervisor never needs to run an interpreter the job
# user can reach. Whatever it writes into the job's dir is opened without following links.

from __future__ import annotations

import _signal as signal  # `signal` without its enums: importing `enum` costs more than all the rest
import contextlib
import ctypes
import errno
import os
import select
import sys
import time

SHELL = "/bin/sh"
PR_SET_CHILD_SUBREAPER = 36
MAX_PENDING = 64 * 1024
"""A line longer than this goes to the combined log unfinished rather than growing without bound."""
RUN_AS_VARIABLE = "HAI_RUN_AS"
LOG_LIMIT_VARIABLE = "HAI_LOG_LIMIT"
"""The most bytes of the command's output the worker's log keeps; after them one line says the rest
was dropped, and the output is still read (a job is never blocked on a full pipe)."""
CODE_DIR_VARIABLE = "HAI_CODE_DIR"
"""The command's directory as the platform checked it (every symlink resolved): entered only after the
switch to the job's account, and only if it is still that directory."""
KILL_TREE_SECONDS = 5.0
FULL = (errno.ENOSPC, errno.EDQUOT)
"""A write that failed because the disk (or the account's quota) is full."""
EXIT_FILE_WAIT_SECONDS = 3600.0
"""How long a supervisor waits for room to write its exit file on a full disk."""
"""How long killing what is left below a supervisor may take before it gives up on stragglers."""


def main(argv: list[str], command_dir: int | None = None) -> int:
    """Run the command in `command_dir` (an open directory; default: where this runs) and report.

    The spawner starts the supervisor in the instance's work dir, which is how a server that never
    saved the instance's handle finds it after a restart (`LocalBackend.reap`), and hands it the
    command's directory open, as it found it when asked.
    """
    exit_file, command = argv[1], argv[2]
    run_as = os.environ.pop(RUN_AS_VARIABLE, None)
    code_dir = os.environ.pop(CODE_DIR_VARIABLE, None)
    limit = os.environ.pop(LOG_LIMIT_VARIABLE, None)
    combined = argv[3] if len(argv) > 4 else None
    prefix = argv[4].encode() if combined is not None else b""
    # The group's SIGTERM/SIGINT/SIGHUP are meant for the command; the supervisor lives on to record
    # how it ended. A handler (unlike SIG_IGN) is reset by exec, so the command keeps the defaults.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _ignore)
    become_subreaper()
    pipe = os.pipe() if combined is not None or limit is not None else None
    pid = os.fork()
    if pid == 0:
        _exec_command(command, pipe, run_as, command_dir, code_dir)
    if command_dir is not None:
        os.close(command_dir)
    ending = _Ending(pid)
    if pipe is None:
        code = ending.wait(block=True)
        assert code is not None
    else:
        os.close(pipe[1])
        code = _pump(ending, pipe[0], _Logs(combined, prefix, int(limit) if limit else None))
    # What the command left running (in the background, or in a session of its own) ends with it.
    kill_tree(os.getpid(), signal.SIGKILL, reap=True)
    _write_atomically(exit_file, f"{code}\n")
    return code if code >= 0 else 128 - code


def _ignore(signum: int, frame: object) -> None:
    pass


def become_subreaper() -> None:
    """Adopt the processes the shell leaves behind (Linux); elsewhere the shell's own end is reported."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def descendants(root: int) -> list[int]:
    """Live (not zombie) processes below `root` in the process tree, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses; the fields after the last ")" are fixed.
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] not in ("Z", "X"):
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    todo = [root]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def kill_tree(
    root: int, sig: int, reap: bool = False, seconds: float = KILL_TREE_SECONDS, session: int | None = None
) -> bool:
    """Send `sig` to every process below `root`; for SIGKILL, again until none is left. True if none is.

    Re-scanning catches what forked meanwhile: a child of a killed process is adopted by the subreaper
    `root` and found by the next scan. With `reap`, `root` is this process and reaps its own children.
    `session`: a session whose processes got `sig` already (through the worker's group, or the rank
    launcher that forwards it to each rank's group); only those that left it are sent it here. A second
    SIGTERM can reach a job that saved and is exiting after its handler is gone, and kill it.
    """
    if reap and not _has_children():
        # Every process below a subreaper is its child or below one, so none is left: no scan of /proc.
        return True
    deadline = time.monotonic() + seconds
    while True:
        pids = descendants(root)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if session is None or os.getsid(pid) != session:
                    os.kill(pid, sig)
        if reap:
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0] > 0:
                    pass
        if not pids or sig != signal.SIGKILL:
            return not pids
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def _has_children() -> bool:
    """True while this process has a child, running or not yet reaped."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


class _Ending:
    """How the command ended: the shell's exit, or, when the shell died of a signal, what it left running.

    Once the shell died of a signal, every child the supervisor still has is a process the shell left
    behind, and the worker ends when the last of them has: with the last nonzero exit code one of them
    chose (75: saved on notice), else 0 if one exited cleanly, else the shell's signal.
    """

    def __init__(self, shell: int) -> None:
        self.shell = shell
        self.shell_code: int | None = None
        self.left_behind: list[int] = []

    def wait(self, block: bool) -> int | None:
        """Reap what has ended; the worker's exit code once it has ended, else None (only if not `block`)."""
        while True:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return self._code()
            if pid == 0:
                return None
            code = os.waitstatus_to_exitcode(status)
            if pid == self.shell:
                self.shell_code = code
                if code >= 0:
                    # A shell that ended by itself has waited for its command; what it left in the
                    # background is the backend's to kill.
                    return code
            elif self.shell_code is not None or self._shell_is_gone():
                self.left_behind.append(code)

    def _shell_is_gone(self) -> bool:
        """True once the shell has exited (reaped or not): a child reaped now was left behind by it."""
        try:
            return os.waitid(os.P_PID, self.shell, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def _code(self) -> int:
        assert self.shell_code is not None, "the shell is the supervisor's child until reaped"
        chosen = [c for c in self.left_behind if c > 0] or [c for c in self.left_behind if c == 0]
        return chosen[-1] if chosen else self.shell_code


def _exec_command(
    command: str,
    pipe: tuple[int, int] | None,
    run_as: str | None,
    command_dir: int | None,
    code_dir: str | None = None,
) -> None:
    try:
        if command_dir is not None:
            os.fchdir(command_dir)
        if run_as:
            switch_account(run_as)
        # Python ignores SIGPIPE and SIGXFSZ; a shell command expects the defaults.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        if pipe is not None:
            os.dup2(pipe[1], 1)
            os.dup2(pipe[1], 2)
            os.close(pipe[0])
            os.close(pipe[1])
        if code_dir is not None:
            _enter(code_dir)
        os.execv(SHELL, [SHELL, "-c", command])
    finally:
        os._exit(127)


def run_as_value(uid: int, gid: int, groups: tuple[int, ...]) -> str:
    """An account as `switch_account` takes it: "uid:gid:group,group..."."""
    return f"{uid}:{gid}:{','.join(map(str, groups))}"


def switch_account(run_as: str) -> None:
    """Become the job's account, `run_as` as `$HAI_RUN_AS` gives it: "uid:gid:group,group..."."""
    uid, gid, groups = run_as.split(":")
    os.setgroups([int(g) for g in groups.split(",") if g])
    os.setgid(int(gid))
    os.setuid(int(uid))


def _enter(code_dir: str) -> None:
    """Enter the code dir as the job's account, and only the directory the platform checked: a path
    swapped for a symlink since then leads elsewhere, and the command does not start."""
    try:
        os.chdir(code_dir)
        now = os.getcwd()
    except OSError as exc:
        _refuse(f"cannot enter code_path {code_dir} as the job's account: {exc.strerror}")
    if now != code_dir:
        _refuse(f"code_path {code_dir} changed after the platform checked it")


def _refuse(message: str) -> None:
    os.write(2, f"hai: {message}; the command was not started\n".encode(errors="replace"))
    os._exit(126)


class _Logs:
    """Where a worker's output goes: our stdout (the worker's log) up to `limit` bytes, then one line
    saying the rest is dropped; and, line by line with `prefix`, the instance's combined log."""

    def __init__(self, combined_path: str | None, prefix: bytes, limit: int | None) -> None:
        self.combined = None
        if combined_path is not None:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
            self.combined = os.open(combined_path, flags, 0o644)
        self.prefix, self.left, self.pending = prefix, limit, b""

    def add(self, data: bytes) -> None:
        if self.left is not None:
            if self.left <= 0:
                return
            if len(data) > self.left:
                self._keep(data[: self.left] + _DROPPED_LINE)
                self.left = 0
                return
            self.left -= len(data)
        self._keep(data)

    def _keep(self, data: bytes) -> None:
        _write_all(1, data)
        if self.combined is not None:
            lines, self.pending = _split_lines(self.pending + data)
            if lines:
                _write_all(self.combined, b"".join(self.prefix + line for line in lines))

    def end(self) -> None:
        if self.combined is not None and self.pending:
            _write_all(self.combined, self.prefix + self.pending + b"\n")


_DROPPED_LINE = (
    b"\n[hai] the log reached [limits] log_bytes_per_instance: the rest of this output is dropped\n"
)


def _pump(ending: _Ending, fd: int, logs: _Logs) -> int:
    """Copy the command's output to its logs as it comes, until it has ended and the pipe is drained."""
    code: int | None = None
    while True:
        # Once the command has ended, only drain what is already there: a background process it left
        # behind may hold the pipe open forever.
        ready = select.select([fd], [], [], 0.2 if code is None else 0)[0]
        if ready:
            data = os.read(fd, 65536)
            if not data:
                break
            logs.add(data)
        if code is None:
            code = ending.wait(block=False)
        if code is not None and not ready:
            break
    logs.end()
    if code is None:
        code = ending.wait(block=True)
        assert code is not None
    return code


def _split_lines(buf: bytes) -> tuple[list[bytes], bytes]:
    """Complete lines (with their newline) and the unfinished rest."""
    head, sep, rest = buf.rpartition(b"\n")
    if not sep:
        return ([rest + b"\n"], b"") if len(rest) > MAX_PENDING else ([], rest)
    return [line + b"\n" for line in head.split(b"\n")], rest


def _write_all(fd: int, data: bytes) -> None:
    """Write a log's bytes; on a full disk they are dropped: the job goes on, its log has a gap."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError as exc:
        if exc.errno not in FULL:
            raise


def _write_atomically(path: str, text: str) -> None:
    """Write the exit file; while the disk is full, try again every second (for EXIT_FILE_WAIT_SECONDS):
    the server learns how the command ended once there is room, instead of taking it for lost."""
    deadline = time.monotonic() + EXIT_FILE_WAIT_SECONDS
    while True:
        try:
            _write_once(path, text)
            return
        except OSError as exc:
            if exc.errno not in FULL or time.monotonic() >= deadline:
                raise
            time.sleep(1.0)


def _write_once(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    # The directory may be the job's: never write through a link or into a file it prepared.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
