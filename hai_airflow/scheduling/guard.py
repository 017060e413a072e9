"""Starvation guard: nodes kept for the first job that cannot be placed even with preemption."""

from __future__ import annotations

from dataclasses import dataclass

from hai_airflow.scheduling.capacity import ANY, FreeCapacity, NodeFree, workers_fitting
from hai_airflow.scheduling.model import Shape


@dataclass(slots=True)
class Guard:
    """The guarded job and its nodes; later jobs in the order may not be placed there this cycle."""

    job_id: int
    nodes: list[NodeFree]
    text: str = ""
    """The node list in words, e.g. `n1,n2` or `n1,n2,n3,n4 and 5 more` (set by `raise_guard`)."""

    def reason(self) -> str:
        return f"nodes {self.text} reserved for job {self.job_id} (starvation guard)"


def node_list(nodes: list[NodeFree], limit: int = 4) -> str:
    """Node names for a reason, at most `limit` of them."""
    names = [f.node.name for f in nodes[: limit + 1]]
    shown = ",".join(names[:limit])
    return shown if len(nodes) <= limit else f"{shown} and {len(nodes) - limit} more"


def nearest_nodes(cap: FreeCapacity, shape: Shape) -> list[NodeFree]:
    """Nodes nearest to fitting the job: most free GPUs (then CPUs, memory) first, enough for all workers.

    Among GPU types (gpu_type None) the type whose chosen nodes have the most free GPUs wins.
    Nodes carrying another job's reservation are left alone.
    """
    best: tuple[int, list[NodeFree]] | None = None
    for pool in cap.pools(shape):
        chosen = enough_nodes(cap, pool, shape)
        if not chosen:
            continue
        free = sum(len(f.gpus) for f in chosen)
        if best is None or free > best[0]:
            best = (free, chosen)
    return best[1] if best else []


def enough_nodes(cap: FreeCapacity, pool: str, shape: Shape) -> list[NodeFree]:
    """The pool's nodes in order of most free GPUs (then CPUs, memory, position) until together,
    when empty, they hold all the shape's workers; [] when the whole pool would not.

    The capacity index lists unblocked nodes by free-GPU count, so only the levels down to the one
    that completes the set are looked at.
    """
    types = cap.types if pool == ANY else (pool,)
    top = max((len(cap.buckets[t]) for t in types), default=0)
    chosen: list[NodeFree] = []
    room = 0
    for count in range(top - 1, -1, -1):
        level = [
            f
            for t in types
            if count < len(cap.buckets[t])
            for f in map(cap.node, cap.buckets[t][count])
            if not f.reserved and workers_fitting(f.node.gpus, f.node.cpus, f.node.memory_gb, shape) > 0
        ]
        level.sort(key=lambda f: (-f.cpus, -f.memory_gb, f.ordinal))
        for f in level:
            chosen.append(f)
            room += workers_fitting(f.node.gpus, f.node.cpus, f.node.memory_gb, shape)
            if room >= shape.workers:
                return chosen
    return []


def raise_guard(cap: FreeCapacity, job_id: int, shape: Shape) -> Guard | None:
    """Block the nearest nodes for `job_id` for the rest of the cycle."""
    nodes = nearest_nodes(cap, shape)
    if not nodes:
        return None
    for f in nodes:
        cap.block(f)
    return Guard(job_id, nodes, text=node_list(nodes))


def fits_with_guard_nodes(cap: FreeCapacity, guard: Guard, shape: Shape) -> bool:
    """Would the shape fit if the guard's nodes were open to it? (Only the guard stops it.) Asked in a
    trial, always undone."""
    with cap.trial():
        for f in guard.nodes:
            cap.unblock(f)
        return cap.fits(shape)
