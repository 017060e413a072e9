"""Task and instance ids as arguments or flags, several at once, completed from the server."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from hai_airflow.cli import flagtable
from hai_airflow.cli.connection import ServerFlags, client_for, exit_code_for
from hai_airflow.cli.flags import argument, choice, completes, option
from hai_airflow.cli.output import error_line, usage_error
from hai_airflow.vocabulary import TERMINAL_STATES, JobState

COMPLETION_SECONDS = 2.0
"""The most a completion may spend asking the server; a slow or absent server completes nothing."""

COMPLETION_LIMIT = 50
"""Completions offered at most: the newest tasks (or their instances)."""

T = TypeVar("T")

JOB_STATES: tuple[str, ...] = tuple(JobState)


def state_option(flag: str, help: str) -> Any:
    """A job-state option: any case in, the API's upper case out, completed from the states."""
    return typer.Option(
        flag,
        metavar="STATE",
        parser=choice(*JOB_STATES, upper=True),
        autocompletion=completes(*JOB_STATES),
        help=help,
        show_default=False,
    )


if TYPE_CHECKING:
    StateOption = Any
else:
    StateOption = option(flagtable.STATE)


def _completion_flags(ctx: typer.Context) -> ServerFlags:
    """The connection flags typed so far on the command line, the command's over the root's."""
    merged = ServerFlags()
    chain = []
    node: Any = ctx
    while node is not None:
        chain.append(node)
        node = node.parent
    for level in reversed(chain):
        given = {k: level.params.get(k) for k in ("server", "token", "region")}
        merged = ServerFlags(**{k: v for k, v in given.items() if v is not None}).over(merged)
    return merged


UNFINISHED = tuple(s for s in JobState if s not in TERMINAL_STATES)
COMPLETED_STATES: dict[str, tuple[str, ...]] = {
    "cancel": UNFINISHED,
    "promote": UNFINISHED,
    "suspend": (JobState.RUNNING,),
    "resume": (JobState.SUSPENDED,),
    "hold": (JobState.PENDING, JobState.SUSPENDED),
    "release": (JobState.PENDING, JobState.SUSPENDED),
    "requeue": tuple(s for s in JobState if s in TERMINAL_STATES and s != JobState.SUCCEEDED),
    "exec": (JobState.RUNNING,),
}
"""The states of the tasks a command's completion offers: those it can act on (any, for the rest)."""


def complete_task_ids(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """Your newest task ids the command can act on, each with its state and name; nothing if the
    server does not answer in time."""
    states = COMPLETED_STATES.get(ctx.info_name or "")
    try:
        with client_for(_completion_flags(ctx), timeout=COMPLETION_SECONDS) as client:
            jobs = client.jobs(limit=COMPLETION_LIMIT, state=",".join(states) if states else None)
    except Exception:
        # Completion runs inside the user's shell: any failure must stay silent.
        return []
    return [(str(j.id), f"{j.state} {j.task_name}") for j in jobs if str(j.id).startswith(incomplete)]


def complete_instance_ids(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """Instance ids of your newest tasks, newest first, within the completion's time budget."""
    deadline = time.monotonic() + COMPLETION_SECONDS
    found: list[tuple[str, str]] = []
    try:
        # Each request gets half the budget, so the one under way when it runs out ends soon after.
        with client_for(_completion_flags(ctx), timeout=COMPLETION_SECONDS / 2) as client:
            for job in client.jobs(limit=COMPLETION_LIMIT):
                if job.instances == 0:
                    continue
                if time.monotonic() > deadline or len(found) >= COMPLETION_LIMIT:
                    break
                for run in reversed(client.instances(job.id)):
                    found.append((str(run.id), f"task {job.id} {job.task_name}"))
    except Exception:
        return found
    return [(value, text) for value, text in found if value.startswith(incomplete)]


def complete_packages(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """The server's resource packages, each with its GPUs; nothing if the server does not answer in time."""
    try:
        with client_for(_completion_flags(ctx), timeout=COMPLETION_SECONDS) as client:
            packages = client.resource_packages()
    except Exception:
        return []
    return [
        (str(p.id), f"{p.name}: {p.gpus}x{p.gpu_type}, {p.cpus:g} CPUs, {p.memory_gb:g} GB")
        for p in packages
        if str(p.id).startswith(incomplete)
    ]


if TYPE_CHECKING:
    TaskIdArguments = Any
    TaskIdFlags = Any
    TaskIdArgument = Any
else:
    TaskIdArguments = argument(flagtable.TASK_IDS, autocompletion=complete_task_ids)
    TaskIdFlags = option(flagtable.TASK_ID_FLAGS, autocompletion=complete_task_ids)
    TaskIdArgument = argument(flagtable.TASK_ID_ARGUMENT, autocompletion=complete_task_ids)


def task_ids(arguments: Sequence[int] | None, flags: Sequence[int] | None, command: str) -> list[int]:
    """The ids given either way, in order, each once; none at all is bad usage."""
    ids = list(dict.fromkeys([*(arguments or ()), *(flags or ())]))
    if not ids:
        usage_error(f"give a task id, as in `hai {command} 42` or --task-id 42. See `hai {command} --help`")
    return ids


def each(ids: Iterable[int], act: Callable[[int], T]) -> tuple[list[T], int]:
    """Act on every id in turn; a refusal prints its own `Error:` line and the rest still run.

    Returns the results of the ids that worked and the exit code: 0 if all did, else the worst
    refusal's (2 bad input, 1 refused or failed).
    """
    from hai_airflow.client import HaiError

    results: list[T] = []
    code = 0
    for job_id in ids:
        try:
            results.append(act(job_id))
        except HaiError as error:
            typer.echo(error_line(error.message), err=True)
            code = max(code, exit_code_for(error))
    return results, code
