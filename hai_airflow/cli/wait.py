"""`hai wait` and `--wait` after a submit: long-poll until tasks end; the exit code is their outcome."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import typer

from hai_airflow.cli import flagtable
from hai_airflow.cli.columns import TIMED_OUT, Outcome, describe, outcome_code, standing
from hai_airflow.cli.connection import RECONNECT_FOR_SECONDS, ServerFlags, connect, reconnect
from hai_airflow.cli.flags import option, with_flags
from hai_airflow.cli.ids import TaskIdArguments, TaskIdFlags, each, task_ids
from hai_airflow.cli.output import OutputFlags, emit, say, stdout_is_terminal, usage_error
from hai_airflow.vocabulary import TERMINAL_STATES, JobState

if TYPE_CHECKING:
    from hai_airflow.client import HaiClient
    from hai_airflow.spec import JobView

POLL_SECONDS = 30.0
"""The longest single long-poll; the server answers sooner when the state changes."""


def _passed_through(client: HaiClient, job_id: int, target: str) -> bool:
    """Did the task ever enter `target`? A short run can pass RUNNING between two long-polls."""
    return any(e.to_state == target for e in client.job(job_id).events)


def await_task(
    client: HaiClient, job_id: int, target: str | None, deadline: float, status: Any = None
) -> Outcome:
    """Long-poll one task until it is in `target` (None: until it ends), it can no longer get there, or
    `deadline` (time.monotonic) passes. `status`, when given, is a rich Status kept up to date."""
    from hai_airflow.client import HaiUnreachable

    job: JobView = client.job(job_id)
    while True:
        if status is not None:
            status.update(standing(job))
        if target is not None and job.state == target:
            return Outcome(job, reached=True)
        if job.state in TERMINAL_STATES:
            if target is None:
                reached = job.state == JobState.SUCCEEDED
            else:
                reached = _passed_through(client, job_id, target)
            return Outcome(job, reached=reached)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return Outcome(job, reached=False, timed_out=True)
        try:
            job = client.wait(job_id, since_state=job.state, timeout=min(remaining, POLL_SECONDS))
        except HaiUnreachable:
            # It answered before: it is restarting, or the network blinked. Go on once it answers.
            job = reconnect(client, lambda: client.job(job_id), status, min(RECONNECT_FOR_SECONDS, remaining))


def progress_status(out: OutputFlags) -> AbstractContextManager[Any]:
    """A spinner with the task's state on a terminal; nothing when piped or printing data."""
    if out.is_data or not (stdout_is_terminal() and sys.stderr.isatty()):
        return nullcontext(None)
    from rich.console import Console

    return Console(stderr=True).status("waiting")


def wait_and_report(
    client: HaiClient, ids: Sequence[int], target: str | None, timeout: float | None, out: OutputFlags
) -> int:
    """Wait for every task (one shared deadline), print one line per task, return the exit code."""
    deadline = time.monotonic() + (math.inf if timeout is None else timeout)
    try:
        with progress_status(out) as status:
            outcomes, code = each(ids, lambda job_id: await_task(client, job_id, target, deadline, status))
    except KeyboardInterrupt:
        # Stopping to wait is not an error of the task, and leaves it running.
        raise typer.Exit(130) from None
    if out.format in ("table", "wide"):
        for outcome in outcomes:
            say(describe(outcome, target))
    elif outcomes:
        jobs = [o.job for o in outcomes]
        emit(jobs[0] if len(ids) == 1 else jobs, (), out=out)
    return max(code, outcome_code(outcomes))


if TYPE_CHECKING:
    TimeoutOption = Any
    ForOption = Any
else:
    TimeoutOption = option(flagtable.TIMEOUT)
    ForOption = option(flagtable.FOR_STATE)

__all__ = ["TIMED_OUT", "Outcome", "describe", "outcome_code"]


@with_flags()
def wait(
    ids: TaskIdArguments = None,
    task_id: TaskIdFlags = None,
    for_state: ForOption = None,
    timeout: TimeoutOption = None,
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """Wait for tasks to end (or reach --for STATE); the exit code is the outcome.

    \b
    Exit codes: 0 succeeded (or reached --for STATE), 1 failed, cancelled or TIMEOUT (or ended without
    reaching it), 124 --timeout passed first, 2 bad usage. One line per task: `task 42 SUCCEEDED`.
    Example: hai wait 42 43 --timeout 3600 && echo all done
    """
    chosen = task_ids(ids, task_id, "wait")
    if out.format == "name":
        usage_error("-o name has nothing to add to `hai wait`. Use -o json, -o yaml or the default lines")
    with connect(connection) as client:
        code = wait_and_report(client, chosen, for_state, timeout, out)
    raise typer.Exit(code)
