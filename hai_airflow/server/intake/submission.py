"""Accepting a job: check what it refers to, resolve its resources, apply the quota rule, store it."""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, delete, func, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from hai_airflow import arrays
from hai_airflow import labels as label_rules
from hai_airflow.backends.local.backend import LocalOptions, unlisted_images
from hai_airflow.scheduling.model import WAITING, Quota
from hai_airflow.scheduling.quota import QuotaVerdict, judge
from hai_airflow.server.control.admission import AnySpec, parse_spec
from hai_airflow.server.errors import ApiError
from hai_airflow.server.intake.group_commit import Intake
from hai_airflow.server.jobs import auth, dependencies
from hai_airflow.server.jobs.auth import Caller
from hai_airflow.server.jobs.paths import check_spec_paths, check_storage_owners
from hai_airflow.server.jobs.views import job_view
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.store import changes, clock
from hai_airflow.server.store.tables import Base, EventRow, GroupRow, InstanceRow, JobRow, UserRow
from hai_airflow.spec import (
    CPU_NEVER_HIGH,
    TERMINAL_STATES,
    CpuJobSpec,
    DistributedJobSpec,
    JobState,
    JobView,
    ResourcePackage,
    StandaloneJobSpec,
    SubmitRequest,
    holds_high_priority,
    is_high,
    priority_class,
)

# Core statements on the tables, built once: a submit is two INSERTs with their parameters, without
# the ORM's unit of work or a statement to build and cache-key per request.
_JOBS, _EVENTS = (Base.metadata.tables[row.__tablename__] for row in (JobRow, EventRow))
_INSERT_JOB = {
    # A known (user, client_key) inserts no row and returns no id: no error to recover from.
    "postgresql": postgresql.insert(_JOBS).on_conflict_do_nothing().returning(_JOBS.c.id),
    "sqlite": sqlite.insert(_JOBS).on_conflict_do_nothing().returning(_JOBS.c.id),
}
_INSERT_EVENT = insert(_EVENTS)
log = logging.getLogger("hai.server.submission")
QUEUED = "waiting for the scheduler"
"""A waiting job's reason until the planner gives its own."""
QUOTA_FIX = "Submit with --max-schedule 0 for low priority, or ask your group admin to raise your quota"


@dataclass(frozen=True)
class Resources:
    workers: int
    gpus_per_worker: int
    cpus_per_worker: float
    memory_gb_per_worker: float
    gpu_type: str | None
    min_workers: int | None = None
    """A resizable job's least workers; None for one that never resizes."""

    @property
    def gpus(self) -> int:
        return self.workers * self.gpus_per_worker


def _package(ctx: ServerContext, pkg_id: int, field: str) -> ResourcePackage:
    packages = ctx.packages
    pkg = packages.get(pkg_id)
    if pkg is None:
        known = ", ".join(f"{p.id} ({p.name})" for p in packages.values()) or "none configured"
        raise ApiError(
            422,
            f"resource package {pkg_id} does not exist",
            field=field,
            fix=f"Pick one listed by `hai res`: {known}",
        )
    return pkg


def resolve_resources(
    ctx: ServerContext, spec: CpuJobSpec | StandaloneJobSpec | DistributedJobSpec
) -> Resources:
    """What the job holds per worker, from its resource package (CPU jobs say it themselves)."""
    if isinstance(spec, CpuJobSpec):
        return Resources(1, 0, spec.cpus, spec.memory_gb, None)
    if isinstance(spec, StandaloneJobSpec):
        field, pkg, workers = "spec.resource_pkg", _package(ctx, spec.resource_pkg, "spec.resource_pkg"), 1
    else:
        field = "spec.worker_resource_pkg"
        pkg, workers = _package(ctx, spec.worker_resource_pkg, field), spec.workers
    if spec.gpu_type is not None and spec.gpu_type.upper() != pkg.gpu_type.upper():
        package = f"resource package {pkg.id} ({pkg.name}, {pkg.gpu_type})"
        raise ApiError(
            422,
            f"gpu_type {spec.gpu_type} does not match {package}",
            field="spec.gpu_type",
            fix=f"Use --gpu-type {pkg.gpu_type} or leave it out, or pick a {spec.gpu_type} package",
        )
    gpu_type = pkg.gpu_type if pkg.gpus > 0 else None
    if pkg.gpus == 0 and isinstance(spec, DistributedJobSpec):
        raise ApiError(
            422,
            f"resource package {pkg.id} ({pkg.name}) has no GPUs; distributed training needs GPU workers",
            field=field,
            fix="Pick a GPU package from `hai res`",
        )
    least = spec.min_workers if isinstance(spec, DistributedJobSpec) and spec.resizable else None
    return Resources(workers, pkg.gpus, pkg.cpus, pkg.memory_gb, gpu_type, least)


def check_references(
    ctx: ServerContext, caller: Caller, spec: CpuJobSpec | StandaloneJobSpec | DistributedJobSpec
) -> None:
    """Refuse what the job names but may not have: unknown or others' storages, paths outside its roots."""
    check_storage_owners(ctx.config, caller, spec)
    check_spec_paths(ctx.config, ctx.home, caller, spec)
    # The local backend runs on this machine, so a missing directory can be refused now
    # instead of failing later as a job.
    local_nas = ctx.config.server.backend == "local" and spec.code_src == "nas"
    if local_nas and not Path(spec.code_path).expanduser().is_dir():
        raise ApiError(
            422,
            f"code_path {spec.code_path} is not a directory on the server",
            field="spec.code_path",
            fix="Point --code-path at the directory holding the training code",
        )
    if ctx.config.server.backend == "local":
        _refuse_unlisted_images(ctx, spec)


def _refuse_unlisted_images(ctx: ServerContext, spec: AnySpec) -> None:
    """With `[backend] unlisted_images = "refuse"`, a local job naming an image it runs without is refused."""
    options = LocalOptions.model_validate(ctx.config.backend)
    if options.unlisted_images != "refuse":
        return
    for field in ("image", "worker_image"):
        if unlisted := unlisted_images(options, [getattr(spec, field, None)]):
            known = ", ".join(sorted(options.images)) or "none"
            raise ApiError(
                422,
                f"image {unlisted[0]} is not available: the local backend runs jobs on the server's machine "
                f"and this server refuses images it has no environment for (images it has: {known})",
                field=f"spec.{field}",
                fix="Leave out --image (and --worker-image) to run with the server's Python, or ask the "
                "admin to list the image under [backend] images",
            )


def _counted() -> ColumnElement[bool]:
    """Jobs that use high-priority quota: unfinished, high priority, and not a waiting job being cancelled."""
    waiting_cancelled = JobRow.cancel_requested.is_(True) & JobRow.state.in_(WAITING)
    high = JobRow.max_schedule > 0  # spec.is_high, in SQL
    return JobRow.state.not_in(TERMINAL_STATES) & high & ~waiting_cancelled


def high_usage(
    session: Session, user: str | None = None, group: str | None = None, exclude: Collection[int] = ()
) -> tuple[dict[str, int], dict[str, int]]:
    """High-priority GPUs in use per user and per group, as `high_gpus` counts them, in one query.

    With `user` and `group`, only their jobs are summed (all a quota check needs); `exclude` are the
    jobs being judged (promoted, or submitted and stored but not judged yet), so none counts twice.
    """
    gpus = func.sum(func.coalesce(JobRow.size, JobRow.workers) * JobRow.gpus_per_worker)
    query = select(JobRow.user_name, JobRow.group_name, gpus).where(_counted())
    if user is not None and group is not None:
        query = query.where((JobRow.user_name == user) | (JobRow.group_name == group))
    if exclude:
        query = query.where(JobRow.id.not_in(exclude))
    per_user: dict[str, int] = {}
    per_group: dict[str, int] = {}
    for owner, owner_group, used in session.execute(query.group_by(JobRow.user_name, JobRow.group_name)):
        per_user[owner] = per_user.get(owner, 0) + int(used or 0)
        per_group[owner_group] = per_group.get(owner_group, 0) + int(used or 0)
    return per_user, per_group


def quota_verdict(
    session: Session, user: str, group: str, gpus: int, exclude: Collection[int] = ()
) -> QuotaVerdict:
    """The quota rule (`judge`) for `gpus` more high-priority GPUs of `user` in `group`."""
    per_user, per_group = high_usage(session, user, group, exclude)
    user_row, group_row = session.get(UserRow, user), session.get(GroupRow, group)
    quota = Quota(
        groups={group: group_row.quota_gpus} if group_row is not None else {},
        users={user: user_row.quota_gpus} if user_row is not None else {},
    )
    return judge(user, group, gpus, per_user.get(user, 0), per_group.get(group, 0), quota)


def _require_quota(session: Session, user: str, group: str, gpus: int, exclude: Collection[int]) -> None:
    """Refuse (409) when high priority would exceed the quota; the caller holds `group`'s lock."""
    verdict = quota_verdict(session, user, group, gpus, exclude)
    if not verdict.allowed:
        raise ApiError(409, f"high priority refused: {verdict.reason}", field="max_schedule", fix=QUOTA_FIX)


def check_quota(
    ctx: ServerContext, session: Session, user: str, group: str, gpus: int, exclude: Collection[int] = ()
) -> None:
    """Refuse (409) when high priority would exceed the user's or the group's quota."""
    ctx.store.lock_group(session, group)
    _require_quota(session, user, group, gpus, exclude)


def waiting_jobs(session: Session, users: Collection[str], exclude: Collection[int] = ()) -> dict[str, int]:
    """How many jobs each of `users` has waiting (queued, suspended, held or waiting for other jobs:
    the WAITING states), in one query; `exclude` are jobs stored by this submit, not counted yet."""
    query = select(JobRow.user_name, func.count()).where(
        JobRow.user_name.in_(sorted(users)), JobRow.state.in_(WAITING)
    )
    if exclude:
        query = query.where(JobRow.id.not_in(exclude))
    counts = dict.fromkeys(users, 0)
    counts.update({user: int(n) for user, n in session.execute(query.group_by(JobRow.user_name))})
    return counts


def too_many_waiting(ctx: ServerContext, user: str, waiting: int, adding: int) -> ApiError | None:
    """The refusal (429) when `adding` more jobs would take `user`'s waiting jobs past
    `[limits] pending_jobs_per_user`; None within it."""
    cap = ctx.config.limits.pending_jobs_per_user
    if waiting + adding <= cap:
        return None
    tasks = f"{adding:,} more tasks" if adding != 1 else "one more task"
    return ApiError(
        429,
        f"{user} has {waiting:,} tasks waiting to start; {tasks} would pass "
        f"[limits] pending_jobs_per_user = {cap:,}",
        field=None,
        fix="Wait for some of your waiting tasks to start, or cancel those you no longer need "
        "(`hai task --state PENDING`, `hai cancel`); the platform admin sets the limit",
    )


def _lock_waiting_counts(ctx: ServerContext, session: Session, groups: Collection[str]) -> None:
    """Serialize the pending-jobs check of these groups' users with other transactions that store
    jobs, each group once and in one order (no deadlock), as the quota check does."""
    for group in sorted(set(groups)):
        ctx.store.lock_group(session, group)


def _existing(session: Session, caller: Caller, key: str) -> JobRow | None:
    """The caller's job submitted with `key`, if any: a client_key names a job among its owner's jobs only."""
    return session.scalar(select(JobRow).where(JobRow.user_name == caller.name, JobRow.client_key == key))


REQUEUABLE: frozenset[JobState] = TERMINAL_STATES - {JobState.SUCCEEDED}
"""Ended jobs `hai requeue` runs again; a success has nothing left to run (submit it again instead)."""


@dataclass(frozen=True)
class Requeue:
    """What a requeue adds to its owner's submit: the ended job it runs again, and from where."""

    job_id: int
    state: JobState
    """The ended job's final state, which its own event records (a requeue never changes it)."""
    checkpoint: str | None
    checkpoint_at: float | None
    by: Caller
    """Who asked: the owner, their group admin or a platform admin."""
    last_event_at: float = 0.0
    """When the ended job's newest event happened: its requeue event is not dated earlier."""

    def how(self) -> str:
        return f"resuming from its checkpoint {self.checkpoint}" if self.checkpoint else "starting afresh"

    def old_event(self, new_id: int, now: float) -> dict[str, Any]:
        """The ended job's event naming the job that runs it again."""
        return {
            "job_id": self.job_id,
            "at": max(now, self.last_event_at),
            "kind": "requeued",
            "from_state": self.state,
            "to_state": self.state,
            "reason": f"requeued as task {new_id} by {self.by.actor}, {self.how()}",
            "actor": self.by.name,
        }


@dataclass(frozen=True)
class Submit:
    """One `POST /jobs`, or a requeue: who the job is for, and what."""

    caller: Caller
    request: SubmitRequest
    requeue: Requeue | None = None


def requeue(s: Session, old: JobRow, by: Caller, fresh: bool) -> Submit:
    """`old`'s owner submitting its spec again, linked to it and, unless `fresh`, resuming from its
    latest checkpoint; refused (409) while it has not ended, or when it succeeded."""
    if old.state not in REQUEUABLE:
        if old.state in TERMINAL_STATES:
            problem = f"it {old.state}; only a {' or '.join(sorted(REQUEUABLE))} job is requeued"
            fix = "Submit it again to run it once more"
        else:
            problem = f"it is {old.state}, not ended"
            fix = f"Wait for it to end (`hai wait {old.id}`); to restart it now, `hai cancel {old.id}` first"
        raise ApiError(409, f"cannot requeue task {old.id}: {problem}", field="job_id", fix=fix)
    owner = by if by.name == old.user_name else auth.user_caller(s, old.user_name)
    if owner is None:
        raise ApiError(
            409,
            f"cannot requeue task {old.id}: its owner {old.user_name} is no longer a user of this server",
            field="job_id",
            fix="Submit the job again as a current user",
        )
    checkpoint, at = (None, None) if fresh else (old.latest_checkpoint, old.latest_checkpoint_at)
    spec = SubmitRequest(spec=parse_spec(old))
    return Submit(owner, spec, Requeue(old.id, old.state, checkpoint, at, by, old.last_event_at or 0.0))


Outcome = tuple[JobView, bool] | BaseException
"""A submit's answer, (its job's view, created), or the refusal or error its request raises."""


@dataclass(frozen=True)
class _Checked:
    """A submit that passed the checks that need no transaction: the job's row and event, ready."""

    submit: Submit
    values: dict[str, Any]
    event: dict[str, Any]
    high: bool
    gpus: int


def _check(ctx: ServerContext, submit: Submit, now: float) -> _Checked:
    """What a submit refers to and resolves to, checked before any transaction (422 when wrong)."""
    caller, longest = submit.caller, ctx.config.limits.max_grace_seconds
    spec, cut = _grace_within(submit.request.spec, longest)
    check_references(ctx, caller, spec)
    res = resolve_resources(ctx, spec)
    if is_high(spec.max_schedule) and not holds_high_priority(spec.max_schedule, res.gpus):
        raise ApiError(422, CPU_NEVER_HIGH[0], field="spec.max_schedule", fix=CPU_NEVER_HIGH[1])
    requeue, waits = submit.requeue, None
    if spec.after or spec.after_any:
        with ctx.store.read() as s:
            waits = dependencies.check(s, caller, spec)
    values = dict(
        task_name=spec.task_name,
        mode=spec.mode,
        user_name=caller.name,
        group_name=caller.group,
        state=JobState.PENDING,
        max_schedule=spec.max_schedule,
        spec=json.dumps(spec.model_dump(mode="json")),
        client_key=submit.request.client_key,
        submitted_via=caller.via,
        model_id=spec.model_id,
        project_id=spec.project_id,
        workers=res.workers,
        gpus_per_worker=res.gpus_per_worker,
        cpus_per_worker=res.cpus_per_worker,
        memory_gb_per_worker=res.memory_gb_per_worker,
        gpu_type=res.gpu_type,
        elastic=spec.elastic,
        min_workers=res.min_workers,
        time_limit_seconds=spec.time_limit_seconds,
        labels=label_rules.encode(spec.labels),
        submitted_at=now,
        last_event_at=now,
        suspended_seconds=0.0,
        runtime_seconds=0.0,
        preemptions=0,
        instance_count=0,
        held=False,
        blocked=waits is not None,
        cancel_requested=False,
        reason=QUEUED if waits is None else dependencies.waiting_reason(waits),
        requeued_from=requeue.job_id if requeue else None,
        # What a requeued job's first instance resumes from (`admission.claim`).
        latest_checkpoint=requeue.checkpoint if requeue else None,
        latest_checkpoint_at=requeue.checkpoint_at if requeue else None,
    )
    what = f"{res.gpus} x {res.gpu_type} GPUs" if res.gpus else "CPU only"
    by = f", submitted by {caller.actor}" if caller.via else ""
    kind, actor = "submitted", caller.name
    reason = f"{spec.mode} job, {what}, {priority_class(spec.max_schedule)} priority{by}{cut}"
    if requeue is not None:
        kind, actor = "requeued", requeue.by.name
        reason += f"; requeued from task {requeue.job_id} by {requeue.by.actor}, {requeue.how()}"
    event = {"at": now, "kind": kind, "from_state": None, "to_state": JobState.PENDING, "reason": reason,
             "actor": actor}
    return _Checked(submit, values, event, is_high(spec.max_schedule), res.gpus)


def _grace_within(spec: AnySpec, longest: int) -> tuple[AnySpec, str]:
    """The spec as stored, its grace cut to `[limits] max_grace_seconds` (`longest`), so the job's page
    shows the grace it gets; and the submit event's note of the cut ('' when none)."""
    asked = spec.effective_grace_seconds
    if asked <= longest:
        return spec, ""
    note = f"; its grace of {asked} s is cut to [limits] max_grace_seconds = {longest} s"
    return spec.model_copy(update={"grace_seconds": longest}), note


def _known(s: Session, checked: _Checked) -> Outcome:
    """The job its owner submitted before with this submit's client_key, or the job an earlier requeue
    of the same job made: a retried submit's or requeue's answer."""
    caller, key, requeue = checked.submit.caller, checked.submit.request.client_key, checked.submit.requeue
    if requeue is not None:
        known = s.scalar(select(JobRow).where(JobRow.requeued_from == requeue.job_id))
    else:
        known = _existing(s, caller, key) if key is not None else None
    if known is None:  # the same key earlier in this batch, refused: stored alone, this one is new
        what = f"requeue of job {requeue.job_id}" if requeue else f"job with client_key {key!r}"
        raise RuntimeError(f"{what} was neither inserted nor found")
    current = s.get(InstanceRow, known.current_instance_id) if known.current_instance_id else None
    return job_view(known, current, clock.now()), False


def _store(ctx: ServerContext, s: Session, batch: list[_Checked]) -> list[Outcome]:
    """Insert the checked submits in the open transaction `s`, then judge the high-priority ones'
    quota in order; one outcome each.

    One INSERT takes every row, with ids known beforehand, and finds the known keys itself (the
    store's unique key per user, and one requeue per job): a row it skipped names a job submitted
    with that key, or requeued from that job, already. The insert comes before the quota check so
    that a retried submit gets its job back even when the quota is full by now; a refusal deletes
    the row again and is this submit's outcome alone.
    """
    ids = ctx.store.job_ids(s, len(batch))
    rows = [{"id": job_id, **c.values} for job_id, c in zip(ids, batch, strict=True)]
    # Keys in one order: two batches inserting the same keys (a retry racing its first try) wait
    # for each other on the unique key in the same order, so they cannot deadlock.
    rows.sort(key=lambda r: (r["user_name"], r["client_key"] or "", r["requeued_from"] or 0))
    inserted = set(s.scalars(_INSERT_JOB[ctx.store.dialect], rows))
    judged = [(job_id, c) for job_id, c in zip(ids, batch, strict=True) if c.high and job_id in inserted]
    high = [job_id for job_id, _ in judged]
    new = [(job_id, c) for job_id, c in zip(ids, batch, strict=True) if job_id in inserted]
    # Each group once, in one order, so that batches of other servers cannot deadlock.
    _lock_waiting_counts(ctx, s, {c.submit.caller.group for _, c in new})
    waiting = waiting_jobs(s, {c.submit.caller.name for _, c in new}, [job_id for job_id, _ in new])
    outcomes: list[Outcome] = []
    events: list[dict[str, Any]] = []
    judging = 0  # the position in `high` of the next high-priority job judged
    for job_id, checked in zip(ids, batch, strict=True):
        if job_id not in inserted:
            outcomes.append(_known(s, checked))
            continue
        owner = checked.submit.caller.name
        if (over := too_many_waiting(ctx, owner, waiting[owner], 1)) is not None:
            _unmake(s, job_id)
            outcomes.append(over)
            continue
        if checked.high:
            caller = checked.submit.caller
            # This job and the batch's later high-priority ones are stored but not judged yet.
            unjudged = high[judging:]
            judging += 1
            try:
                _require_quota(s, caller.name, caller.group, checked.gpus, unjudged)
            except ApiError as refusal:
                _unmake(s, job_id)
                outcomes.append(refusal)
                continue
        waiting[owner] += 1
        events.append({"job_id": job_id, **checked.event})
        if checked.submit.requeue is not None:
            events.append(checked.submit.requeue.old_event(job_id, checked.values["submitted_at"]))
        changes.jobs_changed(s, [job_id])
        view = job_view(JobRow(id=job_id, **checked.values), None, checked.values["submitted_at"])
        outcomes.append((view, True))
    if events:
        s.execute(_INSERT_EVENT, events)
    return outcomes


def _unmake(s: Session, job_id: int) -> None:
    """Remove a job this transaction inserted and then refused: made and removed unseen."""
    changes.jobs_changed(s, [job_id], feed=False)
    s.execute(delete(_JOBS).where(_JOBS.c.id == job_id))


def _store_all(ctx: ServerContext, checked: list[_Checked]) -> list[Outcome]:
    """The checked submits in one transaction. When it fails for something one submit may have caused,
    each is stored again in its own, so that error is that submit's alone; an unusable database
    (`OperationalError`: locked, unreachable) fails them all at once instead of once per submit."""
    try:
        with ctx.store.write() as s:
            return _store(ctx, s, checked)
    except OperationalError as e:
        return [e] * len(checked)
    except Exception as e:
        if len(checked) == 1:
            return [e]
        log.warning("a batch of %d submits failed (%s); storing each alone", len(checked), e)
    return [outcome for c in checked for outcome in _store_all(ctx, [c])]


def submit_array(ctx: ServerContext, submit: Submit) -> tuple[JobView, bool]:
    """One task per index of the request's `array`, in one transaction: all of them or none (a high
    array is judged against the quota for all its GPUs at once). Beyond its `%K`, a task is stored
    blocked; the controller releases one as another ends. The answer is the first task; a retry with
    the same client_key answers the first task of the array made before."""
    try:
        array = arrays.parse(submit.request.array or "")
    except ValueError as error:
        raise ApiError(422, str(error), field="array", fix="Write it like 0-9%2") from None
    checked = _check(ctx, submit, clock.now())
    caller, key, values = submit.caller, submit.request.client_key, checked.values
    with ctx.store.write() as s:
        known = _existing(s, caller, key) if key is not None else None
        if known is not None:
            return job_view(known, None, clock.now()), False
        ids = ctx.store.job_ids(s, len(array.indices))
        rows = [_array_task(values, ids, n, i, array, key) for n, i in enumerate(array.indices)]
        if ids[0] not in set(s.scalars(_INSERT_JOB[ctx.store.dialect], rows)):
            # The same key won a race meanwhile: none of this array is kept; the retry finds it.
            raise ApiError(409, "an array with this client_key was just made", field="client_key",
                           fix="Submit again with the same key to get its first task")  # fmt: skip
        ctx.store.lock_group(s, caller.group)  # the pending-jobs count, and the quota of a high array
        waiting = waiting_jobs(s, [caller.name], ids)[caller.name]
        if (over := too_many_waiting(ctx, caller.name, waiting, len(ids))) is not None:
            raise over  # the transaction is rolled back: none of the array is kept
        if checked.high:
            _require_quota(s, caller.name, caller.group, checked.gpus * len(ids), ids)
        where = f"; task {{}} of array {ids[0]}: {arrays.describe(array)}"
        events = [{"job_id": r["id"], **checked.event} for r in rows]
        for e, r in zip(events, rows, strict=True):
            e["reason"] += where.format(r["array_index"])
        changes.jobs_changed(s, ids)
        s.execute(_INSERT_EVENT, events)
    ctx.wakeup.set()
    ctx.changed.notify()
    return job_view(JobRow(**rows[0]), None, values["submitted_at"]), True


def _array_task(
    values: dict[str, Any], ids: list[int], n: int, index: int, array: arrays.Array, key: str | None
) -> dict[str, Any]:
    """The row of the array's `n`-th task (`index` its index): the first one carries the client_key."""
    waits_for_a_slot = array.limit is not None and n >= array.limit
    row = {**values, "id": ids[n], "client_key": key if n == 0 else None}
    row.update(array_id=ids[0], array_index=index, array_limit=array.limit)
    if waits_for_a_slot and not values["blocked"]:
        row.update(blocked=True, reason=f"waiting for a slot of array {ids[0]} ({array.limit} at once)")
    return row


Submissions = Intake[Submit, tuple[JobView, bool]]
"""The API's submits, stored by `submit_all` in batches (`create_app` makes one per app)."""


def submit_threads(ctx: ServerContext) -> int:
    """Intake threads storing submits. On PostgreSQL two: one batch is checked while another waits
    for the database's answers. On SQLite one: the database runs in this process, so there is no wait
    to fill, and a second thread only contends for the interpreter (it measured slower)."""
    return 1 if ctx.store.is_sqlite else 2


def submit_all(ctx: ServerContext, submits: list[Submit]) -> list[Outcome]:
    """Store each submit's job as PENDING, all in one short write (group commit); one outcome each.

    A refusal (an unknown package, a path outside the roots, a full quota), or any error in checking
    one submit, is that submit's outcome and never fails the others. Run by the API's intake threads
    (`intake.Intake`), several batches at once.
    """
    now = clock.now()
    refused: dict[int, Outcome] = {}
    checked: dict[int, _Checked] = {}
    for i, submit in enumerate(submits):
        try:
            checked[i] = _check(ctx, submit, now)
        except ApiError as refusal:
            refused[i] = refusal
        # whatever else checking one submit raises is that submit's answer, never its batch's
        except Exception as error:
            log.warning("checking a submit of %s failed: %r", submit.caller.name, error)
            refused[i] = error
    stored = dict(zip(checked, _store_all(ctx, list(checked.values())), strict=True)) if checked else {}
    if any(isinstance(o, tuple) and o[1] for o in stored.values()):
        ctx.wakeup.set()
        ctx.changed.notify()  # a watched task list has a new task
    outcomes = refused | stored
    return [outcomes[i] for i in range(len(submits))]
