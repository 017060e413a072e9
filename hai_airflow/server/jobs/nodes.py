"""Nodes and resource packages with what is free on them now."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from hai_airflow.scheduling.capacity import FreeCapacity
from hai_airflow.scheduling.layout import Layout
from hai_airflow.scheduling.model import Shape
from hai_airflow.scheduling.usage import Usage
from hai_airflow.server.jobs.kept import kept_jobs
from hai_airflow.server.jobs.snapshot import current_instances, nodes_of, placement_from_json, planner_job
from hai_airflow.server.jobs.views import when
from hai_airflow.server.store.tables import InstanceRow, JobRow, NodeRow, ReservationRow
from hai_airflow.spec import (
    PLACED,
    JobState,
    NodeState,
    NodeTask,
    NodeTaskView,
    NodeView,
    OtherNodeTaskView,
    ResourcePackage,
    ResourcePackageView,
    canonical_gpu_type,
)


@dataclass
class TaskUse:
    """What one job's instance uses on one node (its workers there summed)."""

    job_id: int
    state: JobState
    task_name: str
    user: str
    group: str
    gpus: list[int] = field(default_factory=list)
    cpus: float = 0
    memory_gb: float = 0


@dataclass
class NodeUse:
    row: NodeRow
    holders: dict[int, int] = field(default_factory=dict)
    cpus: float = 0
    memory_gb: float = 0
    tasks: dict[int, TaskUse] = field(default_factory=dict)
    """Job id -> what its running instance uses here."""

    @property
    def free_gpus(self) -> tuple[int, ...]:
        return tuple(g for g in range(self.row.gpus) if g not in self.holders)

    @property
    def state(self) -> NodeState:
        if not self.row.drained:
            return "ready"
        return "draining" if self.tasks else "drained"


def node_usage(session: Session) -> list[NodeUse]:
    """Each node with the GPUs, CPUs and memory its running instances hold, job by job."""
    nodes = {n.name: NodeUse(n) for n in session.scalars(select(NodeRow).order_by(NodeRow.name))}
    running = session.execute(
        select(
            InstanceRow.placement,
            JobRow.id,
            JobRow.state,
            JobRow.task_name,
            JobRow.user_name,
            JobRow.group_name,
        )
        .join(JobRow, JobRow.id == InstanceRow.job_id)
        .where(InstanceRow.ended_at.is_(None), JobRow.state.in_(PLACED))
        .order_by(JobRow.id)
    )
    for placement, job_id, state, task_name, user, group in running:
        for w in placement_from_json(placement):
            use = nodes.get(w.node)
            if use is None:
                continue
            task = use.tasks.get(job_id)
            if task is None:
                task = use.tasks[job_id] = TaskUse(job_id, state, task_name, user, group)
            for g in w.gpus:
                use.holders[g] = job_id
            task.gpus.extend(w.gpus)
            task.cpus += w.cpus
            task.memory_gb += w.memory_gb
            use.cpus += w.cpus
            use.memory_gb += w.memory_gb
    return list(nodes.values())


def node_views(session: Session, may_see: Callable[[str, str], bool]) -> list[NodeView]:
    """Every node as `GET /nodes` shows it; the jobs on it in full only where `may_see(user, group)`."""
    reserved: dict[str, dict[int, int]] = {}
    for r in session.scalars(select(ReservationRow).order_by(ReservationRow.id)):
        for g in json.loads(r.gpus):
            reserved.setdefault(r.node, {}).setdefault(g, r.job_id)
    views = []
    for u in node_usage(session):
        row = u.row
        views.append(
            NodeView(
                name=row.name,
                gpu_type=row.gpu_type,
                gpus=row.gpus,
                cpus=row.cpus,
                memory_gb=row.memory_gb,
                virtual=row.virtual,
                free_gpus=u.free_gpus,
                holders=dict(sorted(u.holders.items())),
                reserved_for={
                    g: j for g, j in sorted(reserved.get(row.name, {}).items()) if 0 <= g < row.gpus
                },
                cpus_used=round(u.cpus, 6),
                memory_gb_used=round(u.memory_gb, 6),
                tasks=tuple(task_view(t, may_see(t.user, t.group)) for t in u.tasks.values()),
                state=u.state,
                drained_by=row.drained_by,
                drained_at=when(row.drained_at),
                reason=row.drain_reason,
            )
        )
    return views


def task_view(task: TaskUse, shown: bool) -> NodeTask:
    """A job on a node: named only to those who may see it, field by field, so nothing else slips in."""
    gpus, cpus, memory_gb = tuple(sorted(task.gpus)), round(task.cpus, 6), round(task.memory_gb, 6)
    if not shown:
        return OtherNodeTaskView(id=task.job_id, state=task.state, gpus=gpus, cpus=cpus, memory_gb=memory_gb)
    return NodeTaskView(
        id=task.job_id,
        state=task.state,
        gpus=gpus,
        cpus=cpus,
        memory_gb=memory_gb,
        task_name=task.task_name,
        user=task.user,
    )


def free_capacity(session: Session) -> FreeCapacity:
    """Free capacity now as the planner builds it for a cycle: the nodes less what the placed jobs
    hold, drained nodes blocked."""
    rows = kept_jobs(session, JobRow.state.in_(PLACED))
    current = current_instances(session, [r.id for r in rows])
    placed = [planner_job(r, current.get(r.id)) for r in rows]
    return FreeCapacity.build(Usage.fresh(Layout.build(nodes_of(session)), placed))


def startable(pkg: ResourcePackage, cap: FreeCapacity) -> int:
    """How many workers of the package could start now: the most for which the planner's one fit
    question (`FreeCapacity.fits`: every worker placed at once, in one pool) says yes."""

    def fits(workers: int) -> bool:
        gpu_type = canonical_gpu_type(pkg.gpu_type)
        return cap.fits(Shape(gpu_type, workers, pkg.gpus, pkg.cpus, pkg.memory_gb))

    yes, no = 0, 1
    while fits(no):  # a worker takes CPUs (a package's are > 0), so this ends
        yes, no = no, no * 2
    while no - yes > 1:
        mid = (yes + no) // 2
        yes, no = (mid, no) if fits(mid) else (yes, mid)
    return yes


def package_views(session: Session, packages: list[ResourcePackage]) -> list[ResourcePackageView]:
    cap = free_capacity(session)
    return [
        ResourcePackageView(**p.model_dump(), startable_now=startable(p, cap))
        for p in sorted(packages, key=lambda p: p.id)
    ]
