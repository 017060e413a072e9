"""The spec's closed sets of words, importable without pydantic (the CLI builds its flags from them):
job states, `--max-schedule` hours, process layouts. `spec` re-exports each."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args

MaxScheduleHours = Literal[0, 4, 6, 8, 24, 48]
MAX_SCHEDULE_CHOICES: tuple[int, ...] = get_args(MaxScheduleHours)
"""Allowed `--max-schedule` values (hours of expected queueing); 0 = low priority."""


class JobState(StrEnum):
    """Where a job stands; `spec.MOVES` lists every legal change. A job is stored PENDING."""

    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUSPENDING = "SUSPENDING"
    SUSPENDED = "SUSPENDED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"


# The groups of states the code asks about, each stated once here beside the states.
TERMINAL_STATES: frozenset[JobState] = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT}
)
"""Final: the job has ended and never moves again."""
UNFINISHED: frozenset[JobState] = frozenset(JobState) - TERMINAL_STATES
"""Not ended yet: waiting, placed or being suspended."""
WAITING: frozenset[JobState] = frozenset({JobState.PENDING, JobState.SUSPENDED})
"""In the queue, for the planner to admit: not holding GPUs."""
PLACED: frozenset[JobState] = frozenset({JobState.STARTING, JobState.RUNNING, JobState.SUSPENDING})
"""Holding GPUs on its placement: an instance is starting, running or being stopped."""
LIVE: frozenset[JobState] = frozenset({JobState.RUNNING, JobState.SUSPENDING})
"""Its instance runs (started by the backend, not yet ended): it may write checkpoints."""
UNSUCCESSFUL: frozenset[JobState] = TERMINAL_STATES - {JobState.SUCCEEDED}
"""Ended without success: failed, cancelled or out of time."""

Processes = Literal["per-gpu", "per-worker"]
PROCESSES_HELP = (
    "How many processes run the command: per-gpu starts one per GPU of each worker, with the Horovod "
    "and torch.distributed rank variables of each (no launcher needed); per-worker starts one per "
    "worker, for commands that bring their own launcher (torchrun, horovodrun, mpirun)."
)

FIELD_FLAGS: dict[str, str] = {
    "grace_seconds": "grace",
    "time_limit_seconds": "time_limit",
    "labels": "label",
    "memory_gb": "memory",
}
"""Spec fields whose `hai create` flag, and so whose job-file key, has another name: `--time-limit 10m`
(`time_limit: 10m` in a file) sets `time_limit_seconds`. Every other field is named as its flag."""
