"""Starting an admitted job, step by step: claim it, prepare what it names, launch it.

The controller runs these in order and records the outcome (`Controller._admit`); each step is a
function of what the one before gave it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter
from sqlalchemy.orm import Session

from hai_airflow.backends.common.base import Backend, Handle, JobEnvironment, Launch, StartError
from hai_airflow.backends.common.confine import make_beneath
from hai_airflow.scheduling.model import Admit
from hai_airflow.server.jobs import paths, transitions
from hai_airflow.server.jobs.kept import KeptJob
from hai_airflow.server.jobs.snapshot import schedulable
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.store import clock
from hai_airflow.server.store.tables import JobRow
from hai_airflow.spec import WAITING, CpuJobSpec, DistributedJobSpec, JobSpec, StandaloneJobSpec

log = logging.getLogger("hai.server.admission")

AnySpec = CpuJobSpec | StandaloneJobSpec | DistributedJobSpec
_SPEC: TypeAdapter[AnySpec] = TypeAdapter(JobSpec)


MIN_FREE_BYTES = 32 << 20
"""Room the disk of `$HAI_HOME` must have for an instance to start (`no_room`)."""

def parse_spec(row: JobRow | KeptJob) -> AnySpec:
    return _SPEC.validate_json(row.spec)


def granted_grace(spec: AnySpec, longest: int) -> int:
    """The grace a job gets between the stop notice and the kill: its own (`--grace`, or the elastic
    default), at most `[limits] max_grace_seconds` (`longest`), so a victim delays its preemptor no
    longer than the platform allows."""
    return min(spec.effective_grace_seconds, longest)


@dataclass(frozen=True)
class NewInstance:
    """An admitted job's new instance as recorded (the job STARTING) before the backend is asked: plain
    values, no ORM row, so each session that writes the outcome reads the rows itself, by id."""

    job_id: int
    instance_id: int
    requeued_from: int | None
    """The job `hai requeue` ran again (`carryover`), None for a job submitted afresh."""
    first_run: bool
    """Whether this is the job's first instance."""
    spec: AnySpec
    admit: Admit
    job: JobEnvironment
    work_dir: Path
    carried_checkpoint: str | None = None
    """The checkpoint it resumes from as carried over into its own model dir (`carryover`), which the
    outcome's write records on the job and the instance; None when nothing was carried."""


def model_dir(ctx: ServerContext, job_id: int, spec: AnySpec) -> Path:
    """Where the job saves its model: its `model_dir` (a relative one inside the job's directory)."""
    if spec.model_dir:
        path = Path(spec.model_dir).expanduser()
        return path if path.is_absolute() else ctx.jobs_dir(job_id) / path
    return ctx.jobs_dir(job_id) / "model"


def claim(
    s: Session, ctx: ServerContext, wave: list[tuple[JobRow | None, AnySpec, Admit]], holder: str
) -> list[NewInstance]:
    """Move the admitted jobs (their rows, read in this transaction; None if gone) to STARTING, each
    with a new instance row, in one go. A job that stopped waiting meanwhile (a cancel, an admin's
    hold, another controller) is left as it is and not returned."""
    ready = [
        (job, spec, d)
        for job, spec, d in wave
        if job is not None and job.state in WAITING and schedulable(job)  # not held, no cancel pending
    ]
    starts = []
    for job, _, d in ready:
        latest = job.latest_checkpoint
        checkpoint = latest if latest and Path(latest).exists() else None
        # A requeued job's first instance resumes from the checkpoint it carries over.
        resume = d.resume or job.instance_count > 0 or checkpoint is not None
        starts.append(transitions.Start(job, d.placement, resume, checkpoint, d.reason))
    if not starts:
        return []
    instances = transitions.begin_instances(s, starts, clock.now(), holder)
    news = []
    for (job, spec, d), start, inst in zip(ready, starts, instances, strict=True):
        saves_to = model_dir(ctx, job.id, spec)
        work_dir = ctx.jobs_dir(job.id) / "instances" / str(inst.id)
        inst.work_dir, inst.log_path = str(work_dir), str(work_dir / "output.log")
        inst.model_dir = str(saves_to)
        inst.grace_seconds = granted_grace(spec, ctx.config.limits.max_grace_seconds)
        array = None if job.array_id is None or job.array_index is None else (job.array_id, job.array_index)
        env = JobEnvironment(job.user_name, job.group_name, saves_to, start.resume, start.checkpoint, array)
        first = job.instance_count == 1
        news.append(NewInstance(job.id, inst.id, job.requeued_from, first, spec, d, env, work_dir))
    return news


JOB_TREE_MODE = 0o711
"""`$HAI_HOME/jobs`, a job's dir and its `instances`: a job's account passes through to its own
dirs, and lists none of them (which jobs exist, whose model dirs are where)."""


def traverse_only(path: Path) -> None:
    """Make `path` (a dir of the server's own tree) JOB_TREE_MODE, creating it if needed."""
    path.mkdir(mode=JOB_TREE_MODE, exist_ok=True)
    if path.stat().st_mode & 0o777 != JOB_TREE_MODE:
        path.chmod(JOB_TREE_MODE)


def prepare(ctx: ServerContext, new: NewInstance) -> Launch:
    """Check the paths and storages the job names against its owner's rules now (they may have
    changed since submission), make its directories, and say what the backend starts."""
    spec, env = new.spec, new.job
    rules = paths.rules_for(ctx.config, ctx.home, env.user, env.group, ctx.jobs_dir(new.job_id))
    if (problem := paths.launch_problem(ctx.config, rules, spec, env.model_dir)) is not None:
        raise StartError(problem)
    if (problem := paths.launch_storage_problem(ctx.config, env.user, env.group, spec)) is not None:
        raise StartError(problem)
    missing = [sid for sid in spec.project_storage if sid not in ctx.storages]
    if missing:
        raise StartError(f"project storage {missing[0]} is no longer configured on the server")
    own = ctx.jobs_dir(new.job_id)
    for d in (ctx.home / "jobs", own, new.work_dir.parent):
        traverse_only(d)
    if env.model_dir.is_relative_to(own):
        make_beneath(str(own), str(env.model_dir))
    # A model dir the user named elsewhere is made by the backend, as the job's account: root never
    # creates anything through a path a user controls.
    new.work_dir.mkdir(parents=True, exist_ok=True)
    return Launch(
        job_id=new.job_id,
        instance_id=new.instance_id,
        spec=spec,
        placement=new.admit.placement,
        job=env,
        log_path=new.work_dir / "output.log",
        work_dir=new.work_dir,
        storages={sid: ctx.storages[sid] for sid in spec.project_storage},
        grace_seconds=granted_grace(spec, ctx.config.limits.max_grace_seconds),
        paths=rules,
        git_schemes=ctx.config.git.schemes,
        log_bytes=ctx.config.limits.log_bytes_per_instance,
    )


def no_room(home: Path) -> str | None:
    """Why no instance may start now: the disk of `$HAI_HOME` (every instance's dir, log and exit
    files) has less than MIN_FREE_BYTES left. A start would fail there, or its exit go unrecorded and
    the job run again and again; so the jobs wait, saying why, until there is room."""
    try:
        disk = os.statvfs(home)
    except OSError:
        return None
    free = disk.f_bavail * disk.f_frsize
    if free >= MIN_FREE_BYTES:
        return None
    return (
        f"no task starts while the server's disk holding {home} is full ({free >> 20} MB free, "
        f"{MIN_FREE_BYTES >> 20} MB needed); the platform admin must make room"
    )


def launch(ctx: ServerContext, backend: Backend, new: NewInstance) -> tuple[Handle | None, str | None]:
    """Prepare and start the instance: its handle, or why it could not start (in the user's words)."""
    try:
        return backend.start(prepare(ctx, new)), None
    except StartError as e:
        return None, str(e)
    except OSError as e:
        return None, f"{e.strerror or e} ({getattr(e, 'filename', '') or ''})"
    except Exception as e:
        log.exception("starting instance %d failed", new.instance_id)
        return None, f"{type(e).__name__}: {e}"
