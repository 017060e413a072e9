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


TERMINAL_STATES: frozenset[JobState] = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT}
)

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
