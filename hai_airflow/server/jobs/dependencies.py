"""Jobs that wait for other jobs, like Slurm's `--dependency=afterok:N` and `afterany:N`, and the
tasks of an array beyond its `%K`.

A job whose spec names `after` (each must succeed) or `after_any` (each must end), or an array's task
past its limit, is stored `blocked` and kept from the planner. Every cycle the controller looks at the
blocked jobs it keeps: once every job they wait for has ended, and their array has a slot free, it
releases them (the planner sees them from then on), or, when one that had to succeed did not, cancels
them and says which and why. The rules are `verdict` and `within_slots`.

An array's id (its first task's, as `hai cancel` takes it) waited for stands for every task of the
array, as Slurm's `afterok` on an array job waits for all its elements (`waits_over`, `waited_tasks`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from hai_airflow.server.errors import ApiError
from hai_airflow.server.jobs.auth import Caller
from hai_airflow.server.jobs.kept import KeptJob
from hai_airflow.server.store.tables import JobRow
from hai_airflow.spec import TERMINAL_STATES, UNSUCCESSFUL, JobSpec, JobState


@dataclass(frozen=True)
class Waits:
    """What a blocked job waits for."""

    ok: tuple[int, ...]
    """Jobs that must succeed (`after`)."""
    any: tuple[int, ...]
    """Jobs that must end, in any state (`after_any`)."""
    array: int | None = None
    """The array whose slot it waits for, when the array has a limit."""
    limit: int = 0
    """The array's limit: at most this many of its tasks released (and not ended) at once."""
    arrays: tuple[int, ...] = ()
    """Of the jobs waited for, those that are arrays (each stands for all its tasks), where known."""

    @classmethod
    def of_job(cls, job: KeptJob) -> Waits:
        data = json.loads(job.spec)
        after, after_any = tuple(data.get("after") or ()), tuple(data.get("after_any") or ())
        if job.array_id is None or job.array_limit is None:
            return cls(after, after_any)
        return cls(after, after_any, job.array_id, job.array_limit)

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(self.ok + self.any))


@dataclass(frozen=True)
class Verdict:
    release: bool
    """True: every job waited for has ended as needed; False: cancel it (`reason` says why)."""
    reason: str




@dataclass(frozen=True)
class Waited:
    """The jobs some blocked jobs wait for, as the store has them now."""

    states: Mapping[int, JobState]
    """Each waited job's state, and each task's of a waited array."""
    tasks: Mapping[int, tuple[int, ...]]
    """A waited array's id -> its tasks' ids, first task included; a single job is not in it."""


def waits_over(blocked: Mapping[int, Waits], unfinished: Mapping[int, KeptJob]) -> list[int]:
    """The blocked jobs none of whose waited jobs is unfinished: a waited array is unfinished while
    any of its tasks is."""
    arrays = {r.array_id for r in unfinished.values() if r.array_id is not None}
    return [j for j, w in blocked.items() if not any(i in unfinished or i in arrays for i in w.ids)]


def waited_tasks(s: Session, ids: Collection[int]) -> Waited:
    """The states of the jobs `ids` name, each array id standing for all of its tasks."""
    rows = s.execute(
        select(JobRow.id, JobRow.state, JobRow.array_id).where(
            or_(JobRow.id.in_(ids), JobRow.array_id.in_(ids))
        )
    )
    states: dict[int, JobState] = {}
    tasks: dict[int, list[int]] = {}
    for job_id, state, array_id in rows:
        states[job_id] = state
        if array_id is not None and array_id in ids:
            tasks.setdefault(array_id, []).append(job_id)
    return Waited(states, {a: tuple(sorted(t)) for a, t in tasks.items()})


def _expanded(ids: Sequence[int], tasks: Mapping[int, Sequence[int]]) -> list[int]:
    """The jobs `ids` stand for: an array's id for each of its tasks."""
    return [t for i in ids for t in tasks.get(i, (i,))]


def verdict(
    waits: Waits, states: Mapping[int, JobState], tasks: Mapping[int, Sequence[int]] | None = None
) -> Verdict | None:
    """What to do with a blocked job, given the states of the jobs it waits for (`tasks`: a waited
    array's tasks): None while one of them has not ended."""
    tasks = tasks or {}
    if any(states.get(i) not in TERMINAL_STATES for i in _expanded(waits.ids, tasks)):
        return None
    failed = [(i, t) for i in waits.ok for t in tasks.get(i, (i,)) if states[t] != JobState.SUCCEEDED]
    if failed:
        named, first = failed[0]
        of = f" of array {named}" if named in tasks else ""
        return Verdict(False, f"task {first}{of} ended {states[first]}, so its --after can never be met")
    if not waits.ids:
        return Verdict(True, f"a slot of array {waits.array} came free; released to the scheduler")
    return Verdict(True, f"{_tasks(waits.ids)} ended as it waited for; released to the scheduler")


def within_slots(
    ready: Sequence[int], blocked: Mapping[int, Waits], unfinished: Mapping[int, KeptJob]
) -> list[int]:
    """Of the jobs whose waits are over, those their array lets go now: per array, as many as it has
    slots free (each of its unfinished tasks not blocked takes one), lowest index first."""
    taken = Counter(r.array_id for r in unfinished.values() if r.array_id is not None and not r.blocked)
    chosen = []
    for job_id in sorted(ready, key=lambda j: (unfinished[j].array_index or 0, j)):
        w = blocked[job_id]
        if w.array is None:
            chosen.append(job_id)
        elif taken[w.array] < w.limit:
            taken[w.array] += 1
            chosen.append(job_id)
    return chosen


def waiting_reason(waits: Waits) -> str:
    """Why a blocked job waits, as `hai queue` and `hai task` show it."""
    parts = []
    if waits.ok:
        parts.append(f"{_tasks(waits.ok, waits.arrays)} to succeed (--after)")
    if waits.any:
        parts.append(f"{_tasks(waits.any, waits.arrays)} to end (--after-any)")
    return "waiting for " + " and ".join(parts)


def _tasks(ids: Sequence[int], arrays: Collection[int] = ()) -> str:
    if any(i in arrays for i in ids):
        return ", ".join(f"every task of array {i}" if i in arrays else f"task {i}" for i in ids)
    return ("task " if len(ids) == 1 else "tasks ") + ", ".join(map(str, ids))


def check(s: Session, caller: Caller, spec: JobSpec) -> Waits | None:
    """The job's waits, refused (422) when one names a job the submitter may not see, or one that
    ended so that it can never be met; None when it waits for nothing."""
    waits = Waits(tuple(spec.after), tuple(spec.after_any))
    if not waits.ids:
        return None
    rows = {r.id: r for r in s.scalars(select(JobRow).where(JobRow.id.in_(waits.ids)))}
    tasks = waited_tasks(s, waits.ids)
    for field, ids in (("after", waits.ok), ("after_any", waits.any)):
        for i in ids:
            row = rows.get(i)
            if row is None or not caller.may_see(row.user_name, row.group_name):
                raise ApiError(
                    422, f"{field}: task {i} not found", field=f"spec.{field}",
                    fix="Name tasks you may see (`hai task --all` lists them)",
                )  # fmt: skip
            failed = [t for t in tasks.tasks.get(i, (i,)) if tasks.states[t] in UNSUCCESSFUL]
            if field == "after" and failed:
                first = failed[0]
                what = f"task {first}" + (f" of array {i}" if i in tasks.tasks else "")
                raise ApiError(
                    422, f"after: {what} already ended {tasks.states[first]}; this task could never start",
                    field="spec.after", fix=f"Wait for a task that can still succeed, or use --after-any {i}",
                )  # fmt: skip
    return Waits(waits.ok, waits.any, arrays=tuple(sorted(tasks.tasks)))
