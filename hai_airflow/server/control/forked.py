"""Pure CPU work of the server's in a forked child, so that it does not hold the interpreter lock the
controller's thread needs: a forecast of a long queue is seconds of Python, and in a thread beside
the controller it made each cycle wait for the lock after every database round trip (cycles 30-50%
slower while it ran, `benchmarks/cycle_bench.py`).

The child sees the parent's memory as it was at the fork (nothing is copied to it), runs the
function, sends back the pickled result through a pipe and exits. It must only compute: it never
logs, never touches the store, and neither collects garbage (finalizers of objects shared with the
parent, such as database connections, must not run) nor handles the server's signals.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
NICENESS = 10
"""How much lower the child's CPU priority is than the server's."""


class ChildFailed(RuntimeError):
    """The child died, or its function raised (its exception's type and message are kept)."""


def run_apart(work: Callable[[], T]) -> T:
    """`work()`, computed in a forked child (in this process where `os.fork` does not exist)."""
    if not hasattr(os, "fork"):
        return work()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            gc.disable()
            os.nice(NICENESS)  # where CPUs are few, the controller's cycles go first
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            os.close(read)
            try:
                answer: tuple[bool, object] = (True, work())
            except Exception as e:
                answer = (False, f"{type(e).__name__}: {e}")
            data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
            view = memoryview(data)
            while view:
                view = view[os.write(write, view) :]
        except BaseException:
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as answer_pipe:
        data = answer_pipe.read()
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:  # reaped already (SIGCHLD ignored): its answer, whole or not, says
        status = 0
    if status != 0 or not data:
        raise ChildFailed(f"the child computing apart ended with status {status} and no answer")
    try:
        ok, value = pickle.loads(data)
    except Exception as e:  # cut short: the child died while it wrote
        raise ChildFailed(f"the child's answer was cut short ({e})") from None
    if not ok:
        raise ChildFailed(str(value))
    return value
