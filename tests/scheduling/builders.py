"""Fluent builders for planner tests: `job(1).low().gpus(8).running_since(T0 - 600).on("n1")`."""

from __future__ import annotations

from dataclasses import replace

from hai_airflow.scheduling.model import (
    Job,
    Node,
    Quota,
    Reservation,
    Snapshot,
    WorkerPlacement,
)
from hai_airflow.spec import JobState

T0 = 1_700_000_000.0
"""`now` of every table test; other times are written relative to it."""


def node(
    name: str, gpu_type: str = "V100", gpus: int = 8, cpus: float = 32, memory_gb: float = 256,
    drained: bool = False,
) -> Node:
    return Node(name, gpu_type, gpus, cpus, memory_gb, drained)


def wp(node_name: str, *gpus: int, cpus: float = 0, memory_gb: float = 0) -> WorkerPlacement:
    return WorkerPlacement(node_name, tuple(gpus), cpus, memory_gb)


class JobBuilder:
    """A job under construction; every method returns the builder so calls chain."""

    def __init__(self, job_id: int) -> None:
        self._job = Job(id=job_id, user="alice", group="vision", state="PENDING", max_schedule=0,
                        submitted_at=T0 - 60, gpus_per_worker=1, gpu_type="V100")

    def _set(self, **changes: object) -> JobBuilder:
        self._job = replace(self._job, **changes)  # type: ignore[arg-type]
        return self

    def high(self, hours: int = 4) -> JobBuilder:
        return self._set(max_schedule=hours)

    def low(self) -> JobBuilder:
        return self._set(max_schedule=0)

    def gpus(self, per_worker: int, gpu_type: str | None = "V100") -> JobBuilder:
        return self._set(gpus_per_worker=per_worker, gpu_type=gpu_type)

    def any_type(self) -> JobBuilder:
        return self._set(gpu_type=None)

    def cpu_only(self, cpus: float, memory_gb: float) -> JobBuilder:
        return self._set(gpus_per_worker=0, gpu_type=None, cpus_per_worker=cpus,
                         memory_gb_per_worker=memory_gb)

    def resources(self, cpus: float, memory_gb: float) -> JobBuilder:
        return self._set(cpus_per_worker=cpus, memory_gb_per_worker=memory_gb)

    def workers(self, n: int) -> JobBuilder:
        return self._set(workers=n)

    def resizable(self, least: int, most: int | None = None) -> JobBuilder:
        """Resizable down to `least` workers; asked for `most` (default: the workers it has)."""
        return self._set(min_workers=least, max_workers=most or self._job.workers)

    def by(self, user: str, group: str = "vision") -> JobBuilder:
        return self._set(user=user, group=group)

    def submitted(self, at: float) -> JobBuilder:
        return self._set(submitted_at=at)

    def state(self, state: JobState) -> JobBuilder:
        return self._set(state=state)

    def running_since(self, at: float) -> JobBuilder:
        return self._set(state="RUNNING", started_at=at, submitted_at=min(self._job.submitted_at, at))

    def suspending(self) -> JobBuilder:
        return self._set(state="SUSPENDING")

    def suspended(self, since: float, before: float = 0) -> JobBuilder:
        return self._set(state="SUSPENDED", suspended_at=since, suspended_seconds=before, preemptions=1)

    def checkpoint_at(self, at: float) -> JobBuilder:
        return self._set(last_checkpoint_at=at)

    def on(self, *nodes: str, first: int = 0) -> JobBuilder:
        """Place one worker per node name, on GPUs first..first+gpus_per_worker-1."""
        j = self._job
        gpus = tuple(range(first, first + j.gpus_per_worker))
        placement = tuple(WorkerPlacement(n, gpus, j.cpus_per_worker, j.memory_gb_per_worker) for n in nodes)
        return self._set(placement=placement, workers=len(nodes))

    def build(self) -> Job:
        return self._job


def job(job_id: int) -> JobBuilder:
    return JobBuilder(job_id)


def snapshot(
    nodes: list[Node],
    jobs: list[JobBuilder | Job],
    *,
    policy: str = "seed",
    users: dict[str, int | None] | None = None,
    groups: dict[str, int | None] | None = None,
    reservations: tuple[Reservation, ...] = (),
) -> Snapshot:
    built = tuple(j.build() if isinstance(j, JobBuilder) else j for j in jobs)
    return Snapshot(tuple(nodes), built, Quota(groups or {}, users or {}), reservations, policy)
