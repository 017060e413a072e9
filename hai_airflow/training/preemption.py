"""The preemption notice: the platform asks an elastic job to save and exit by a file or SIGTERM."""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any

# sysexits.h EX_TEMPFAIL ("try again later"): the job saved its progress on request and wants to be
# resumed. Distinct from 0 so that the platform never mistakes a suspended job for a finished one.
EXIT_SAVED_ON_NOTICE = 75

NOTICE_ENV = "HAI_PREEMPT_NOTICE"

_sigterm_received = False


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Only a flag: the training step in progress finishes and the loop saves at a step boundary.
    # And no lock (not even threading.Event's): Python runs a handler between bytecodes, so a second
    # SIGTERM (the platform signals both the launcher and every process under it) can run this
    # handler again inside the first one, where waiting for a lock the first holds never ends.
    global _sigterm_received
    _sigterm_received = True


def install_preemption_handler() -> Any:
    """Make SIGTERM a request to save and exit instead of an immediate death; returns the previous handler.

    Must be called from the main thread (Python delivers signals there only).
    """
    return signal.signal(signal.SIGTERM, _on_sigterm)


def restore_handler(previous: Any) -> None:
    """Put back the SIGTERM handler that ``install_preemption_handler`` replaced."""
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)


def ignore_sigterm() -> None:
    """From now on SIGTERM does nothing: the job has saved and is on its way out.

    A Python-level handler is not enough: the interpreter puts the default action back before it
    tears down its modules (which takes a while with torch loaded), and a SIGTERM then would turn
    the exit into a death by signal. An ignored signal stays ignored to the end. SIGKILL after the
    grace period still ends a process that hangs.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def sigterm_received() -> bool:
    """True once SIGTERM arrived after ``install_preemption_handler``."""
    return _sigterm_received


def notice_file() -> str | None:
    """The notice file the platform creates when it wants this job to save and exit, if it named one."""
    return os.environ.get(NOTICE_ENV) or None


def preemption_requested() -> bool:
    """True once the notice file exists or SIGTERM arrived: save now and exit."""
    if _sigterm_received:
        return True
    path = notice_file()
    return path is not None and os.path.exists(path)
