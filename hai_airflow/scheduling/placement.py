"""Gang placement: every worker of a job fits (best-fit, lowest GPU indices) or none is placed."""

from __future__ import annotations

from hai_airflow.scheduling.capacity import FreeCapacity, NodeFree, workers_fitting
from hai_airflow.scheduling.layout import NodeKinds
from hai_airflow.scheduling.model import Placement, Shape, WorkerPlacement


def best_fit(cap: FreeCapacity, pool: str, shape: Shape) -> NodeFree | None:
    """Best fit: the unblocked node with the fewest free GPUs that still holds one worker."""
    for f in cap.candidates(pool, shape.gpus):
        if f.fits(shape):
            return f
    return None


def take_worker(cap: FreeCapacity, f: NodeFree, shape: Shape) -> WorkerPlacement:
    """Place one worker on the node, on its lowest free GPU indices (deterministic)."""
    gpus = tuple(f.gpus[: shape.gpus])
    cap.take(f, gpus, shape.cpus, shape.memory_gb)
    return WorkerPlacement(f.node.name, gpus, shape.cpus, shape.memory_gb)


def pool_order(cap: FreeCapacity, shape: Shape) -> list[str]:
    """Try the pool whose best-fit node is tightest first (limits fragmentation across types)."""
    pools = cap.pools(shape)
    if len(pools) < 2:
        return list(pools)
    tightness: list[tuple[int, str]] = []
    for pool in pools:
        f = best_fit(cap, pool, shape)
        if f is not None:
            tightness.append((len(f.gpus), pool))
    return [pool for _, pool in sorted(tightness)]


def place(cap: FreeCapacity, shape: Shape) -> Placement | None:
    """Gang rule: all workers on nodes of one pool, each on one node, or nothing (index unchanged).

    Workers are placed one at a time by best fit; a whole-node worker uses up its node, so such
    workers land on distinct nodes. Greedy per worker cannot miss a gang that fits, because every
    worker is identical and each placement lowers the pool's worker room by exactly one.
    """
    for pool in pool_order(cap, shape):
        with cap.trial() as trial:
            placement = place_in_pool(cap, pool, shape)
            if placement is not None:
                trial.commit()
                return placement
    return None


def place_in_pool(cap: FreeCapacity, pool: str, shape: Shape) -> Placement | None:
    """Every worker by best fit in one pool; None once a worker finds no node (the caller undoes the rest)."""
    taken: list[WorkerPlacement] = []
    for _ in range(shape.workers):
        f = best_fit(cap, pool, shape)
        if f is None:
            return None
        taken.append(take_worker(cap, f, shape))
    return tuple(taken)


def describe_shape(shape: Shape) -> str:
    """A shape in user words: `8xV100 on one node`, `4 workers of 8xA100`, `2 CPUs / 8 GB`."""
    if shape.gpus == 0:
        worker = f"{shape.cpus:g} CPUs / {shape.memory_gb:g} GB"
    else:
        worker = f"{shape.gpus}x{shape.gpu_type or 'GPU (any type)'}"
    if shape.workers == 1:
        return f"{worker} on one node"
    return f"{shape.workers} workers of {worker}"


def describe_placement(placement: Placement, limit: int = 3) -> str:
    """A placement in user words: `n1 GPUs 0-3`, `n1 GPUs 0-7, n2 GPUs 0-7`, `n4` for CPU jobs."""
    parts = []
    for w in placement[:limit]:
        if not w.gpus:
            parts.append(w.node)
        elif list(w.gpus) == list(range(w.gpus[0], w.gpus[-1] + 1)) and len(w.gpus) > 1:
            parts.append(f"{w.node} GPUs {w.gpus[0]}-{w.gpus[-1]}")
        else:
            parts.append(f"{w.node} GPU{'s' if len(w.gpus) > 1 else ''} {','.join(map(str, w.gpus))}")
    if len(placement) > limit:
        parts.append(f"and {len(placement) - limit} more workers")
    return ", ".join(parts)


def never_fits(kinds: NodeKinds, shape: Shape) -> str | None:
    """Reject rule: the job cannot fit even on the empty cluster; says why, else None."""
    types = sorted(kinds)
    if shape.gpus > 0 and shape.gpu_type is not None and shape.gpu_type not in kinds:
        return f"no node has GPU type {shape.gpu_type} (this cluster has {', '.join(types) or 'none'})"
    pools = [t for t in types if shape.gpu_type in (None, t)] if shape.gpus > 0 else types
    if shape.gpus == 0:
        merged: dict[tuple[int, float, float], int] = {}
        for t in types:
            for size, count in kinds[t].items():
                merged[size] = merged.get(size, 0) + count
        groups = [merged]
    else:
        groups = [kinds[t] for t in pools]
    best_room = 0
    for sizes in groups:
        room = sum(count * workers_fitting(g, c, m, shape) for (g, c, m), count in sizes.items())
        if room >= shape.workers:
            return None
        best_room = max(best_room, room)
    kind = f"{shape.gpu_type} " if shape.gpus > 0 and shape.gpu_type else ""
    top = max((g for sizes in groups for (g, _, _) in sizes), default=0)
    if shape.gpus > top:
        return f"needs {shape.gpus} GPUs per worker; the largest {kind}node has {top}"
    if best_room == 0:
        return (f"needs {shape.cpus:g} CPUs / {shape.memory_gb:g} GB per worker; no {kind}node with "
                f"{shape.gpus} GPUs has that much")
    return f"needs {describe_shape(shape)}; the whole cluster has room for {best_room}"


def shortfall(cap: FreeCapacity, shape: Shape) -> str:
    """Why the shape does not fit now, in user words (free resources only)."""
    pools = cap.pools(shape)
    if shape.gpus == 0:
        return f"needs {describe_shape(shape)}; no node has that much CPU and memory free"
    largest = max((cap.largest_free_block(p) for p in pools), default=0)
    if largest < shape.gpus:
        return f"needs {describe_shape(shape)}; largest free block is {largest}"
    if shape.workers > 1:
        room = max((cap.count_fitting(p, shape, shape.workers) for p in pools), default=0)
        return f"needs {describe_shape(shape)}; room for {room} now"
    return (f"needs {describe_shape(shape)}; nodes with {shape.gpus} free GPUs lack "
            f"{shape.cpus:g} CPUs / {shape.memory_gb:g} GB free")
