"""The exec reaper: runs one `hai exec` command as a child subreaper and kills all it leaves behind."""

# Started by `local.execs.run_local` as `python -I -S exec_reaper.py`, as the server's user, in a session of
# its own, with its output pipe as stdout and stderr. Its request (the command's argv and environment,
# the job's account, the server's pid, a pidfd of the worker's supervisor) comes as one JSON document on
# stdin: the job's environment (LD_PRELOAD, PYTHON*) only ever reaches the command, never this
# interpreter, which may be root's.
#
# It becomes a child subreaper, so whatever the command starts stays below it in the process tree, also
# after `setsid` or a double fork. It ends that whole tree with SIGKILL when the command ends (what it
# left running goes with it), when it is told to (SIGTERM/SIGINT/SIGHUP: the exec's timeout, the caller
# hung up, the server stops), when the worker's supervisor ends (the job ended or was cancelled), or
# when the server itself is gone. Then it exits with the command's exit code (128 + N for signal N).
# It holds the output pipe until then, so the server's read of it ends only once nothing is left.
#
# With `[backend] run_as` it stays the server's user and only the command drops to the job's account:
# the job cannot signal, trace or stop the process that ends its leftovers.

from __future__ import annotations

import _signal as signal
import json
import os
import select
import sys

if __package__:
    from hai_airflow.backends.local.supervisor import become_subreaper, kill_tree, switch_account
else:  # run as a script: -I leaves its directory off the path; appended, it cannot shadow the stdlib
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    from supervisor import become_subreaper, kill_tree, switch_account  # type: ignore[no-redef]

STOP = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
"""Signals that tell the reaper to end the command and all below it."""
KILLED = 128 + signal.SIGKILL


def main() -> int:
    """Run the requested command below this reaper, end all that is below when it must; its code."""
    request = json.loads(sys.stdin.buffer.read())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the command gets no stdin
    os.close(devnull)
    become_subreaper()
    wakeup = _signals_to_pipe()
    server = _server(request["server"])
    if server is None:
        return KILLED  # the server was gone before the command started: nobody reads its output
    watched = [server] if request["worker_fd"] is None else [server, request["worker_fd"]]
    for fd in watched:
        os.set_inheritable(fd, False)
    child = os.fork()
    if child == 0:
        _exec(request["argv"], request["env"], request["run_as"])
    code = _wait(child, wakeup, watched)
    # Whatever is still below: the command's leftovers, or all of it when it was told to end.
    kill_tree(os.getpid(), signal.SIGKILL, reap=True)
    return KILLED if code is None else code


def _server(pid: int) -> int | None:
    """A pidfd of the server that started the reaper; None when it is no longer its parent."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    if os.getppid() != pid:  # it died before the pidfd was taken: the pid may be someone else's now
        os.close(fd)
        return None
    return fd


def _signals_to_pipe() -> int:
    """Deliver SIGCHLD and the stop signals as bytes on a pipe, read with the pidfds in one select."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write)
    for sig in (signal.SIGCHLD, *STOP):
        signal.signal(sig, _noted)
    return read


def _noted(signum: int, frame: object) -> None:
    pass


def _wait(child: int, wakeup: int, watched: list[int]) -> int | None:
    """The command's exit code once it has ended; None as soon as it must be ended instead."""
    while True:
        ready = select.select([wakeup, *watched], [], [])[0]
        if wakeup in ready and STOP.intersection(os.read(wakeup, 256)):
            return None
        if any(fd in ready for fd in watched):
            return None
        code = _reap(child)
        if code is not None:
            return code


def _reap(child: int) -> int | None:
    """Reap what has ended (the command, or orphans the reaper adopted); the command's code if it was."""
    code = None
    try:
        while True:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return code
            if pid == child:
                ended = os.waitstatus_to_exitcode(status)
                code = 128 - ended if ended < 0 else ended
    except ChildProcessError:
        return code


def _exec(argv: list[str], env: dict[str, str], run_as: str | None) -> None:
    """Become the command, as the job's account, with the default signal handling a command expects."""
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; a command expects defaults
            signal.signal(sig, signal.SIG_DFL)
        if run_as:
            switch_account(run_as)
        os.execve(argv[0], argv, env)
    except OSError as exc:
        os.write(2, f"hai: the command could not start: {exc}\n".encode(errors="replace"))
    finally:
        os._exit(127)


if __name__ == "__main__":
    sys.exit(main())
