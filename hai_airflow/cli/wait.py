"""`hai wait` and `--wait` after a submit: long-poll until tasks end; the exit code is their outcome."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hai_airflow.cli.connection import RECONNECT_FOR_SECONDS, ServerFlags, connect, reconnect
from hai_airflow.cli.flags import with_flags
from hai_airflow.cli.ids import TaskIdArguments, TaskIdFlags, each, state_option, task_ids
from hai_airflow.cli.output import OutputFlags, emit, say, standing, stdout_is_terminal, usage_error
from hai_airflow.vocabulary import TERMINAL_STATES, JobState

if TYPE_CHECKING:
    from hai_airflow.client import HaiClient
    from hai_airflow.spec import JobView

TIMED_OUT = 124
"""Exit code when --timeout passes first: the one GNU `timeout` uses, apart from 1 (failed) and 2 (usage)."""

POLL_SECONDS = 30.0
"""The longest single long-poll; the server answers sooner when the state changes."""


@dataclass(frozen=True)
class Outcome:
    """How waiting for one task ended: the task as last seen, whether it reached the awaited state,
    and whether time ran out first."""

    job: JobView
    reached: bool
    timed_out: bool = False

    @property
    def exit_code(self) -> int:
        """0 reached, 124 timed out, 1 ended elsewhere (failed, cancelled, or past the awaited state)."""
        if self.reached:
            return 0
        return TIMED_OUT if self.timed_out else 1


def outcome_code(outcomes: Sequence[Outcome]) -> int:
    """The exit code of several waits: 1 if any task failed, else 124 if any timed out, else 0."""
    codes = {o.exit_code for o in outcomes}
    return 1 if 1 in codes else (TIMED_OUT if TIMED_OUT in codes else 0)


def describe(outcome: Outcome, target: str | None) -> str:
    """One result line: `task 42 SUCCEEDED`, `task 42 FAILED (exit code 3)`, `task 42 still PENDING ...`."""
    job = outcome.job
    if outcome.timed_out:
        return f"task {job.id} still {job.state} when the wait timed out"
    line = f"task {job.id} {job.state}"
    if not outcome.reached and job.reason:
        line += f" ({job.reason})"
    if target is not None and not outcome.reached:
        line += f"; it will not reach {target}"
    return line


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


TimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        metavar="SECONDS",
        min=0,
        help=f"Give up after this many seconds and exit {TIMED_OUT}. Default: wait as long as it takes.",
        show_default=False,
    ),
]


@with_flags()
def wait(
    ids: TaskIdArguments = None,
    task_id: TaskIdFlags = None,
    for_state: Annotated[
        str | None,
        state_option("--for", "Wait until the task is in this state (e.g. RUNNING). Default: until it ends."),
    ] = None,
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
