"""The ledger: what the store's history must show, whatever failed on the way.

Every job is in one state that its events lead to, one legal move (`spec.MOVES`) after another, in
time order; no job had two runs at once; no GPU was held by two runs at once, nor a node's GPUs
overcommitted; high-priority GPUs in use never exceeded a user's or a group's quota (`over_quota`, the
scheduler's own rule, against the quotas as they are now). Checked from the rows, not from what the
controller believes: `hai admin check` runs it on a live store, and the fault tests after every fault.

A run holds its GPUs from its claim (`created_at`) until it ended (`ended_at`); a run released and a
run claimed at the same instant do not overlap. A job is high priority from its submission when its
`max_schedule` says so, or from when it was promoted from low; a run counts as high when the job was
at its claim.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from hai_airflow.scheduling.model import Quota
from hai_airflow.scheduling.quota import over_quota
from hai_airflow.server.jobs.snapshot import placement_from_json, quota_of
from hai_airflow.server.store.tables import EventRow, InstanceRow, JobRow, NodeRow
from hai_airflow.spec import MOVES, TERMINAL_STATES, JobState, holds_high_priority


@dataclass(frozen=True)
class Problem:
    job_id: int | None
    what: str


@dataclass(frozen=True)
class Event:
    at: float
    kind: str
    from_state: JobState | None
    to_state: JobState | None


@dataclass(frozen=True)
class Run:
    """One instance's hold on GPUs: `gpus` are (node, index) pairs; `end` None while it holds them."""

    job_id: int
    instance_id: int
    start: float
    end: float | None
    gpus: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class JobRecord:
    id: int
    state: JobState
    user: str
    group: str
    high_from: float | None
    """When it became high priority (its submission, or its first promotion); None: never."""
    events: tuple[Event, ...]
    """In the order they were written."""
    runs: tuple[Run, ...]


def history_problems(job: JobRecord) -> list[Problem]:
    """The job's state moves: legal, each from where the last one led, in time order, ending where
    the job is."""
    found: list[Problem] = []
    state: JobState | None = None  # its first event stores it PENDING
    last_at = -math.inf
    for e in job.events:
        if e.at < last_at:
            found.append(Problem(job.id, f"event {e.kind} at {e.at:.3f} is older than the one before it"))
        last_at = max(last_at, e.at)
        if e.to_state is None or (e.to_state == e.from_state == state):
            continue  # what happened to it where it stood
        if e.from_state != state:
            found.append(
                Problem(job.id, f"event {e.kind} moves from {e.from_state}, but the job was {state}")
            )
        elif (state, e.to_state) not in MOVES and not (state is None and e.to_state == JobState.PENDING):
            found.append(Problem(job.id, f"event {e.kind}: {state} -> {e.to_state} is not a legal move"))
        state = e.to_state
    if state != job.state:
        found.append(Problem(job.id, f"the job is {job.state}, but its events lead to {state}"))
    return found


def run_problems(job: JobRecord) -> list[Problem]:
    """No two runs of the job at once; none still holding GPUs once the job has ended."""
    found: list[Problem] = []
    runs = sorted(job.runs, key=lambda r: (r.start, r.instance_id))
    for before, after in itertools.pairwise(runs):
        if before.end is None or before.end > after.start:
            found.append(Problem(job.id, f"instances {before.instance_id} and {after.instance_id} overlap"))
    if job.state in TERMINAL_STATES:
        found += [Problem(job.id, f"instance {r.instance_id} never ended") for r in runs if r.end is None]
    return found


def _timeline(jobs: Iterable[JobRecord]) -> list[tuple[float, int, Run]]:
    """Claims (+1) and releases (-1) of every run in time order; at one instant, releases first."""
    moments: list[tuple[float, int, int, Run]] = []
    for job in jobs:
        for run in job.runs:
            moments.append((run.start, 1, run.instance_id, run))
            moments.append((math.inf if run.end is None else run.end, -1, run.instance_id, run))
    moments.sort(key=lambda m: m[:3])
    return [(at, sign, run) for at, sign, _, run in moments]


def capacity_problems(jobs: Sequence[JobRecord], nodes: dict[str, int]) -> list[Problem]:
    """No GPU held by two runs at once, none that its node does not have."""
    found: list[Problem] = []
    holder: dict[tuple[str, int], int] = {}
    for _at, sign, run in _timeline(jobs):
        for gpu in run.gpus:
            if sign < 0:
                if holder.get(gpu) == run.instance_id:
                    del holder[gpu]
                continue
            node, index = gpu
            if index >= nodes.get(node, 0):
                found.append(Problem(run.job_id, f"instance {run.instance_id} held GPU {index} of {node}, "
                                                 f"which has {nodes.get(node, 0)}"))  # fmt: skip
            if gpu in holder:
                found.append(Problem(run.job_id, f"instance {run.instance_id} took GPU {index} of {node} "
                                                 f"while instance {holder[gpu]} held it"))  # fmt: skip
            holder[gpu] = run.instance_id
    return found


def quota_problems(jobs: Sequence[JobRecord], quota: Quota) -> list[Problem]:
    """High-priority GPUs in use never over a user's or a group's quota, at any claim."""
    found: list[Problem] = []
    owner = {j.id: j for j in jobs}
    per_user: dict[str, int] = defaultdict(int)
    per_group: dict[str, int] = defaultdict(int)
    for at, sign, run in _timeline(jobs):
        job = owner[run.job_id]
        if job.high_from is None or job.high_from > run.start or not run.gpus:
            continue
        gpus = len(run.gpus)
        if sign > 0:
            over = over_quota(job.user, job.group, gpus, per_user[job.user], per_group[job.group], quota)
            if over is not None:
                found.append(Problem(job.id, f"instance {run.instance_id} at {at:.3f}: {over}"))
        per_user[job.user] += sign * gpus
        per_group[job.group] += sign * gpus
    return found


def problems(jobs: Sequence[JobRecord], nodes: dict[str, int], quota: Quota) -> list[Problem]:
    """Everything the ledger finds wrong, job by job, then across jobs."""
    found = [p for job in jobs for p in (*history_problems(job), *run_problems(job))]
    return found + capacity_problems(jobs, nodes) + quota_problems(jobs, quota)


PROMOTED_FROM_LOW = "max_schedule 0 ->"
"""How a `promoted` event of a low job begins (`routes/jobs.promote_job`)."""


def high_from(submitted_at: float, high_now: bool, events: Iterable[tuple[float, str, str]]) -> float | None:
    """When the job became high priority, from its `promoted` events (at, kind, reason)."""
    for at, kind, reason in events:
        if kind == "promoted":
            return at if reason.startswith(PROMOTED_FROM_LOW) else submitted_at
    return submitted_at if high_now else None


def from_store(session: Session) -> tuple[list[JobRecord], dict[str, int], Quota]:
    """Every job with its events and runs, the nodes' GPU counts and the quotas, read from the store."""
    events: dict[int, list[EventRow]] = defaultdict(list)
    for e in session.scalars(select(EventRow).order_by(EventRow.id)):
        events[e.job_id].append(e)
    runs: dict[int, list[Run]] = defaultdict(list)
    for i in session.scalars(select(InstanceRow).order_by(InstanceRow.id)):
        held = tuple((w.node, g) for w in placement_from_json(i.placement) for g in w.gpus)
        runs[i.job_id].append(Run(i.job_id, i.id, i.created_at, i.ended_at, held))
    jobs = []
    for row in session.scalars(select(JobRow).order_by(JobRow.id)):
        mine = events.get(row.id, [])
        high_now = holds_high_priority(row.max_schedule, row.workers * row.gpus_per_worker)
        jobs.append(
            JobRecord(
                row.id, JobState(row.state), row.user_name, row.group_name,
                high_from(row.submitted_at, high_now, ((e.at, e.kind, e.reason) for e in mine)),
                tuple(Event(e.at, e.kind, e.from_state, e.to_state) for e in mine),
                tuple(runs.get(row.id, ())),
            )
        )  # fmt: skip
    nodes = {n.name: n.gpus for n in session.scalars(select(NodeRow))}
    return jobs, nodes, quota_of(session)
