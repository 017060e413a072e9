"""Nodes and resource packages with what is free on them now."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from hai_airflow.server.snapshot import PLACED, placement_from_json
from hai_airflow.server.tables import InstanceRow, JobRow, NodeRow
from hai_airflow.spec import NodeView, ResourcePackage, ResourcePackageView


@dataclass
class NodeUse:
    row: NodeRow
    holders: dict[int, int] = field(default_factory=dict)
    cpus: float = 0
    memory_gb: float = 0

    @property
    def free_gpus(self) -> tuple[int, ...]:
        return tuple(g for g in range(self.row.gpus) if g not in self.holders)


def node_usage(session: Session) -> list[NodeUse]:
    """Each node with the GPUs, CPUs and memory its running instances hold."""
    nodes = {n.name: NodeUse(n) for n in session.scalars(select(NodeRow).order_by(NodeRow.name))}
    running = session.execute(
        select(InstanceRow.job_id, InstanceRow.placement)
        .join(JobRow, JobRow.id == InstanceRow.job_id)
        .where(InstanceRow.ended_at.is_(None), JobRow.state.in_(PLACED))
    )
    for job_id, placement in running:
        for w in placement_from_json(placement):
            use = nodes.get(w.node)
            if use is None:
                continue
            for g in w.gpus:
                use.holders[g] = job_id
            use.cpus += w.cpus
            use.memory_gb += w.memory_gb
    return list(nodes.values())


def node_views(session: Session) -> list[NodeView]:
    return [
        NodeView(
            name=u.row.name,
            gpu_type=u.row.gpu_type,
            gpus=u.row.gpus,
            cpus=u.row.cpus,
            memory_gb=u.row.memory_gb,
            virtual=u.row.virtual,
            free_gpus=u.free_gpus,
            holders=dict(sorted(u.holders.items())),
        )
        for u in node_usage(session)
    ]


def startable(pkg: ResourcePackage, usage: list[NodeUse]) -> int:
    """How many workers of the package fit on free capacity now (GPUs, CPUs and memory)."""
    total = 0
    for u in usage:
        if pkg.gpus > 0 and u.row.gpu_type.upper() != pkg.gpu_type.upper():
            continue
        fits = [
            int((u.row.cpus - u.cpus) // pkg.cpus),
            int((u.row.memory_gb - u.memory_gb) // pkg.memory_gb),
        ]
        if pkg.gpus > 0:
            fits.append(len(u.free_gpus) // pkg.gpus)
        total += max(0, min(fits))
    return total


def package_views(session: Session, packages: list[ResourcePackage]) -> list[ResourcePackageView]:
    usage = node_usage(session)
    return [
        ResourcePackageView(**p.model_dump(), startable_now=startable(p, usage))
        for p in sorted(packages, key=lambda p: p.id)
    ]
