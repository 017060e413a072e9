"""What `hai task`, `instance`, `res`, `wait` and `cancel` show of the API's records: their columns and
result lines, for the full `hai` and the downloadable one alike. Standard library only, Python 3.8+; a
record is anything with the API's fields as attributes (a pydantic view, or JSON read as attributes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hai_airflow import durations
from hai_airflow.cli.listing import Column, age, duration, placement, state_style, when
from hai_airflow.vocabulary import TERMINAL_STATES

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from datetime import datetime
    from typing import Any


def standing(job: Any) -> str:
    """`task 42 is FAILED: git clone failed`: where a task stands and why."""
    return f"task {job.id} is {job.state}" + (f": {job.reason}" if job.reason else "")


def priority(job: Any) -> str:
    """`high (24h)` or `low`: the class and the expected queueing time that chose it."""
    return f"high ({job.max_schedule}h)" if job.priority == "high" else "low"


def gpus(job: Any) -> str:
    """`8 V100`, `16 A100 (2x8)` for distributed jobs, `0` for CPU jobs; a resizable job adds its
    least workers, `32 A100 (4x8, min 2)`, and a shrunk one what it runs at of what it asked for,
    `16/32 A100 (2/4 workers x 8, min 2)`."""
    if not job.gpus:
        return "0"
    # `JobShapeView.resized`, read from the fields JSON carries too.
    resized = job.size != job.workers
    per_worker = job.gpus // max(job.workers, 1)
    total = f"{job.size * per_worker}/{job.gpus}" if resized else str(job.gpus)
    text = f"{total} {job.gpu_type}" if job.gpu_type else total
    if job.mode != "distributed":
        return text
    shape = f"{job.size}/{job.workers} workers x {per_worker}" if resized else f"{job.workers}x{per_worker}"
    least = f", min {job.min_workers}" if job.min_workers is not None else ""
    return f"{text} ({shape}{least})"


def processes(job: Any, default: str | None) -> str | None:
    """`per-gpu (16 processes)`: how the command is started and how many copies run; None for CPU jobs.
    `default` is the mode's, for a job stored before the field existed (None: not known here)."""
    chosen = job.spec.get("processes") or default
    if not chosen:
        return None
    size = max(job.size, 1)
    count = size * (job.gpus // max(job.workers, 1)) if chosen == "per-gpu" else size
    return f"{chosen} ({count} process{'es' if count != 1 else ''})"


def time_limit(job: Any) -> str | None:
    """`4h (1h30m left)` while it may run, `4h` once ended; None without a limit."""
    limit = job.spec.get("time_limit_seconds")
    if not limit:
        return None
    if job.state in TERMINAL_STATES:
        return durations.text(limit)
    return f"{durations.text(limit)} ({durations.text(max(0, limit - round(job.runtime_seconds)))} left)"


def forecast(job: Any) -> str | None:
    """The latest forecast in words: `starts ~<time> (history)`, a running job's expected end and
    suspension, or how far the forecast looked without reaching the job."""
    f = job.forecast
    if f is None:
        return None
    source = f" ({f.source})" if f.source else ""
    if f.start_at is not None:
        return f"starts ~{when(f.start_at)}{source}"
    if f.end_at is not None:
        suspended = f", may be suspended ~{when(f.suspension_at)}" if f.suspension_at is not None else ""
        return f"ends ~{when(f.end_at)}{source}{suspended}"
    return f"not before {when(f.horizon)}" if f.horizon is not None else None


def job_columns(now: datetime, with_user: bool) -> tuple[Column, ...]:
    """`hai task`'s columns; USER where the listing can span users, and always with -o wide."""
    return (
        Column("ID", lambda j: j.id, "right"),
        Column("NAME", lambda j: j.task_name),
        Column("USER", lambda j: j.user, wide=not with_user),
        Column("GROUP", lambda j: j.group, wide=True),
        Column("MODE", lambda j: j.mode),
        Column("PRIORITY", priority),
        Column("STATE", lambda j: j.state, style=lambda j: state_style(j.state)),
        Column("GPUS", gpus),
        Column("AGE", lambda j: age(j.submitted_at, now), "right"),
        Column("SUBMITTED", lambda j: when(j.submitted_at), wide=True),
        Column("ENDED", lambda j: when(j.ended_at), wide=True),
        Column("RUNTIME", lambda j: duration(j.runtime_seconds), "right"),
        Column("PREEMPTIONS", lambda j: j.preemptions, "right"),
        Column("PLACEMENT", lambda j: placement(j.placement), wide=True),
        Column("LATEST CHECKPOINT", lambda j: j.latest_checkpoint),
        Column("REASON", lambda j: j.reason, wide=True),
    )


def labels(job: Any) -> str:
    """`team=vision, stage=train`, sorted by key."""
    return ", ".join(f"{k}={v}" for k, v in sorted(job.spec.get("labels", {}).items()))


def job_detail_columns(default_processes: Callable[[str], str | None]) -> tuple[Column, ...]:
    """`hai task 42`'s fields; `default_processes(mode)` fills in a job stored before `processes`."""
    return (
        Column("id", lambda j: j.id),
        Column("name", lambda j: j.task_name),
        Column("user", lambda j: f"{j.user} (group {j.group})"),
        Column("mode", lambda j: j.mode),
        Column("state", lambda j: j.state, style=lambda j: state_style(j.state)),
        Column("reason", lambda j: j.reason),
        Column("priority", priority),
        Column("gpus", gpus),
        Column("processes", lambda j: processes(j, default_processes(j.mode))),
        Column("placement", lambda j: placement(j.placement)),
        Column("image", lambda j: j.spec.get("image")),
        Column("code path", lambda j: j.spec.get("code_path")),
        Column("command", lambda j: j.spec.get("cmd")),
        Column("submitted", lambda j: when(j.submitted_at)),
        Column("submitted via", lambda j: j.submitted_via),
        Column("requeued from", lambda j: j.requeued_from and f"task {j.requeued_from}"),
        Column("started", lambda j: when(j.started_at)),
        Column("ended", lambda j: when(j.ended_at)),
        Column("runtime", lambda j: duration(j.runtime_seconds)),
        Column("time limit", time_limit),
        Column("forecast", forecast),
        Column("array", lambda j: j.array_id and f"task {j.array_index} of array {j.array_id}"),
        Column(
            "labels", lambda j: ", ".join(f"{k}={v}" for k, v in sorted(j.spec.get("labels", {}).items()))
        ),
        Column("instances", lambda j: j.instances),
        Column("preemptions", lambda j: j.preemptions),
        Column("latest checkpoint", lambda j: j.latest_checkpoint),
        Column("checkpoint saved", lambda j: when(j.latest_checkpoint_at)),
    )


def transition(event: Any) -> str | None:
    """`PENDING -> STARTING`, or just the new state."""
    if event.from_state and event.to_state:
        return f"{event.from_state} -> {event.to_state}"
    return event.to_state


EVENT_COLUMNS = (
    Column("AT", lambda e: when(e.at)),
    Column("EVENT", lambda e: e.kind),
    Column("STATE", transition),
    Column("BY", lambda e: e.actor),
    Column("REASON", lambda e: e.reason),
)


def end_reason(instance: Any) -> str:
    """`running`, `completed`, `preempted by task 7`, ... in the words `hai task` uses."""
    if instance.end_reason is None:
        return "running" if instance.ended_at is None else "ended"
    if instance.end_reason == "preempted" and instance.preempted_by is not None:
        return f"preempted by task {instance.preempted_by}"
    return str(instance.end_reason)


def start_kind(instance: Any) -> str:
    """`first start`, or the checkpoint a resumed run loaded."""
    if not instance.resume:
        return "first start"
    return f"resume from {instance.checkpoint}" if instance.checkpoint else "resume (no checkpoint yet)"


INSTANCE_COLUMNS = (
    Column("ID", lambda i: i.id, "right"),
    Column("TASK", lambda i: i.job_id, "right", wide=True),
    Column("STARTED", lambda i: when(i.started_at)),
    Column("ENDED", lambda i: when(i.ended_at)),
    Column("PLACEMENT", lambda i: placement(i.placement)),
    Column("EXIT CODE", lambda i: i.exit_code, "right"),
    Column("END REASON", end_reason),
    Column("START", start_kind),
)

PACKAGE_COLUMNS = (
    Column("ID", lambda p: p.id, "right"),
    Column("NAME", lambda p: p.name),
    Column("GPU TYPE", lambda p: p.gpu_type),
    Column("GPUS", lambda p: p.gpus, "right"),
    Column("CPUS", lambda p: f"{p.cpus:g}", "right"),
    Column("MEMORY", lambda p: f"{p.memory_gb:g} GB", "right"),
    Column("STARTABLE NOW", lambda p: p.startable_now, "right"),
)

TIMED_OUT = 124
"""Exit code when a wait's time passes first: the one GNU `timeout` uses, apart from 1 and 2."""


@dataclass(frozen=True)
class Outcome:
    """How waiting for one task ended: the task as last seen, whether it reached the awaited state,
    and whether time ran out first."""

    job: Any
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


def outcome_line(done: str, doing: str, job: Any, done_states: frozenset[str]) -> str:
    """`cancelled task 7 (now CANCELLED)` once done, `cancelling task 7 (now RUNNING)` while on its way."""
    verb = done if job.state in done_states else doing
    return f"{verb} task {job.id} (now {job.state})"


def cancel_line(job: Any) -> str:
    """`hai cancel`'s line for one task, or for an array (its first task's id)."""
    if job.array_id == job.id:
        return f"cancelling array {job.id}: every task of it not ended yet"
    return outcome_line("cancelled", "cancelling", job, TERMINAL_STATES)


def id_runs(ids: Sequence[int]) -> str:
    """`12-21` for consecutive ids, else them all: `12,14,15`."""
    if len(ids) > 1 and list(ids) == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(map(str, ids))
