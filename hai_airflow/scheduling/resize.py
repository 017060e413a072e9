"""Resizing: shrink a running resizable job by whole workers for a high-priority job, grow it back
when GPUs free.

A resize restarts the job at its new size from the checkpoint it saves on the notice, so it loses
the time since that save and the restart; a suspension idles the whole job until GPUs free. So when
giving up workers of one resizable job makes room, the cycle shrinks it rather than suspending
anything, keeping as many of its workers as it can. Whether it fits is asked the cycle's one way:
release the workers in a trial, `FreeCapacity.fits`, undo.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hai_airflow.scheduling.capacity import FreeCapacity
from hai_airflow.scheduling.model import Job, Placement, Shape
from hai_airflow.scheduling.placement import place_in_pool
from hai_airflow.spec import JobState

SETTLE_SECONDS = 30.0
"""A job grows only once it has run this long since its last start: each resize restarts it, and a
restart pays its start-up (loading, the rendezvous) before it trains again. Growing sooner could
throw that away before it was earned, and a job shrunk for a short high job would thrash."""


@dataclass(frozen=True, slots=True)
class Cut:
    """A shrink the cycle may decide: the job keeps `kept` (its first workers) and frees `freed`."""

    job: Job
    kept: Placement
    freed: Placement


def resizing(job: Job) -> bool:
    """Being restarted at a new size: asked to stop, its size already the new one. Its reservation
    (the GPUs it comes back on) is kept while it stops."""
    return job.state == JobState.SUSPENDING and job.resizable and job.workers != len(job.placement)


def can_shrink(job: Job) -> bool:
    """Running at more than its least workers, on a placement of its current size."""
    return job.resizable and job.min_workers < job.workers == len(job.placement)


def least_cut(cap: FreeCapacity, shape: Shape, job: Job) -> Cut | None:
    """The fewest of the job's last workers whose release makes room for the whole gang; None when
    even shrinking it to its least workers would not (asked in a trial, always undone)."""
    placement = job.placement
    with cap.trial():
        for keep in range(len(placement) - 1, job.min_workers - 1, -1):
            cap.release_workers(placement[keep : keep + 1])
            if cap.fits(shape):
                return Cut(job, placement[:keep], placement[keep:])
    return None


def find_cut(cap: FreeCapacity, shape: Shape, candidates: Sequence[Job], taken: set[int]) -> Cut | None:
    """The first resizable candidate, in victim order, whose shrinking alone makes room."""
    for job in candidates:
        if job.id not in taken and can_shrink(job):
            cut = least_cut(cap, shape, job)
            if cut is not None:
                return cut
    return None


def pool_of(cap: FreeCapacity, job: Job) -> str | None:
    """The GPU type the job's workers run on (a gang never spans two)."""
    for w in job.placement:
        f = cap.named(w.node)
        if f is not None:
            return f.node.gpu_type
    return None


def can_grow(job: Job, now: float) -> bool:
    """Running below all it asked for, on a placement of its current size, settled since its start."""
    return (
        job.resizable
        and len(job.placement) == job.workers < job.max_workers
        and (job.started_at is None or now - job.started_at >= SETTLE_SECONDS)
    )


def growth(cap: FreeCapacity, job: Job, most: int) -> Placement | None:
    """New workers for the job, as many as fit up to `most`, in its pool; taken from `cap` (the
    caller's trial keeps or undoes them). None when not one fits."""
    pool = pool_of(cap, job)
    if pool is None or most < 1:
        return None
    wanted = Shape(pool, most, job.gpus_per_worker, job.cpus_per_worker, job.memory_gb_per_worker)
    room = min(most, cap.count_fitting(pool, wanted, most))
    if room < 1:
        return None
    return place_in_pool(cap, pool, wanted._replace(workers=room))


def describe_resize(job: Job, to: int) -> str:
    """`2 of its 4 workers` for a job's new size."""
    return f"{to} of its {job.max_workers} workers"
