"""Free capacity during one cycle: per-node free resources indexed by GPU type and free-GPU count."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from hai_airflow.scheduling.layout import Layout
from hai_airflow.scheduling.model import Job, Node
from hai_airflow.scheduling.usage import NodeFreeBase, Usage

EPS = 1e-9
"""Slack for float CPU/memory sums, so 0.1 + 0.2 CPUs still fit on 0.3."""

ANY = "*"
"""Pool name for CPU-only workers: they may go on any node."""


class Shape(NamedTuple):
    """What a job asks for: `workers` identical workers, each on one node of one GPU type.

    A tuple, because shapes key the per-cycle memos and are hashed once per queued job.
    """

    gpu_type: str | None
    workers: int
    gpus: int
    cpus: float
    memory_gb: float

    @classmethod
    def of(cls, job: Job) -> Shape:
        workers = job.workers if job.workers > 1 else 1  # once per queued job per cycle: no max()
        return cls(job.gpu_type, workers, job.gpus_per_worker, job.cpus_per_worker, job.memory_gb_per_worker)


def workers_fitting(gpus: int, cpus: float, memory_gb: float, shape: Shape) -> int:
    """How many of the shape's workers fit in these free resources (capped at its worker count)."""
    n = shape.workers
    if shape.gpus > 0 and gpus < n * shape.gpus:
        n = gpus // shape.gpus
    if shape.cpus > 0 and cpus + EPS < n * shape.cpus:
        n = int((cpus + EPS) // shape.cpus)
    if shape.memory_gb > 0 and memory_gb + EPS < n * shape.memory_gb:
        n = int((memory_gb + EPS) // shape.memory_gb)
    return n if n > 0 else 0


@dataclass(slots=True)
class NodeFree:
    """One node's free resources this cycle (mutable working copy; the snapshot is never touched)."""

    node: Node
    ordinal: int
    gpus: list[int]
    cpus: float
    memory_gb: float
    blocked: bool = False
    """Held by the starvation guard: no placement and no victims here this cycle."""
    reserved: bool = False
    """Carries GPUs reserved for a waiting job (never picked by the starvation guard)."""

    def fits(self, shape: Shape) -> int:
        return workers_fitting(len(self.gpus), self.cpus, self.memory_gb, shape)


@dataclass(slots=True)
class FreeCapacity:
    """Nodes bucketed by (GPU type, free GPU count); each bucket lists node ordinals ascending.

    A node's working copy (`NodeFree`) is made the first time the cycle looks at it, so a cycle
    pays for the nodes it visits, not for the whole cluster.
    """

    layout: Layout
    base: Mapping[int, NodeFreeBase]
    """Free resources of the nodes with something in use (read-only; the others start all free)."""
    buckets: dict[str, list[list[int]]]
    made: dict[int, NodeFree] = field(default_factory=dict)
    version: int = 0
    """Bumped on every change, so derived figures (reasons) can be cached until it moves."""

    @classmethod
    def build(cls, usage: Usage) -> FreeCapacity:
        """The index at the start of a cycle: the nodes minus what the holding jobs use."""
        buckets = {t: [list(b) for b in lists] for t, lists in usage.buckets.items()}
        return cls(usage.layout, usage.free, buckets)

    @property
    def types(self) -> tuple[str, ...]:
        return self.layout.types

    def node(self, i: int) -> NodeFree:
        """The working copy of the node at ordinal `i`."""
        f = self.made.get(i)
        if f is None:
            n = self.layout.nodes[i]
            base = self.base.get(i)
            if base is None:
                f = NodeFree(n, i, list(range(n.gpus)), n.cpus - 0.0, n.memory_gb - 0.0)
            else:
                f = NodeFree(n, i, list(base[0]), base[1], base[2])
            self.made[i] = f
        return f

    def named(self, name: str) -> NodeFree | None:
        """The working copy of the node called `name`; None for a node the snapshot does not have."""
        i = self.layout.ordinal.get(name)
        return None if i is None else self.node(i)

    def named_node(self, name: str) -> NodeFree:
        """The working copy of a node known to be in the snapshot (KeyError otherwise)."""
        return self.node(self.layout.ordinal[name])

    def all_nodes(self) -> Iterator[NodeFree]:
        for i in range(len(self.layout.nodes)):
            yield self.node(i)

    def _unlist(self, f: NodeFree) -> None:
        if not f.blocked:
            bucket = self.buckets[f.node.gpu_type][len(f.gpus)]
            del bucket[bisect_left(bucket, f.ordinal)]

    def _list(self, f: NodeFree) -> None:
        if not f.blocked:
            insort(self.buckets[f.node.gpu_type][len(f.gpus)], f.ordinal)

    def take(self, f: NodeFree, gpus: Sequence[int], cpus: float, memory_gb: float) -> None:
        """Use these GPUs (which must be free) and this much CPU and memory on the node."""
        self._unlist(f)
        for g in gpus:
            f.gpus.remove(g)
        f.cpus -= cpus
        f.memory_gb -= memory_gb
        self._list(f)
        self.version += 1

    def give(self, f: NodeFree, gpus: Sequence[int], cpus: float, memory_gb: float) -> None:
        """Return GPUs, CPU and memory to the node (undo of `take`)."""
        self._unlist(f)
        for g in gpus:
            insort(f.gpus, g)
        f.cpus += cpus
        f.memory_gb += memory_gb
        self._list(f)
        self.version += 1

    def restrict(self, f: NodeFree, gpus: Sequence[int], cpus: float, memory_gb: float) -> None:
        """Set the node's free resources outright (used after a tentative release)."""
        self._unlist(f)
        f.gpus = sorted(gpus)
        f.cpus, f.memory_gb = cpus, memory_gb
        self._list(f)
        self.version += 1

    def block(self, f: NodeFree) -> None:
        """Take the node out of placement for the rest of the cycle (starvation guard)."""
        self._unlist(f)
        f.blocked = True
        self.version += 1

    def unblock(self, f: NodeFree) -> None:
        f.blocked = False
        self._list(f)
        self.version += 1

    def pools(self, shape: Shape) -> tuple[str, ...]:
        """Where the shape may go: its GPU type, every type (gpu_type None), or ANY for CPU workers."""
        if shape.gpus == 0:
            return (ANY,)
        if shape.gpu_type is None:
            return self.types
        return (shape.gpu_type,) if shape.gpu_type in self.buckets else ()

    def candidates(self, pool: str, min_gpus: int) -> Iterator[NodeFree]:
        """Unblocked nodes of the pool with at least `min_gpus` free, fewest free GPUs first (best fit)."""
        if pool == ANY:
            top = max((len(b) for b in self.buckets.values()), default=0)
            for count in range(min_gpus, top):
                for t in self.types:
                    for i in self.buckets[t][count]:
                        yield self.node(i)
            return
        buckets = self.buckets[pool]
        for count in range(min_gpus, len(buckets)):
            for i in buckets[count]:
                yield self.node(i)

    def largest_free_block(self, pool: str) -> int:
        """The most free GPUs on one unblocked node of the pool."""
        pools = self.types if pool == ANY else (pool,)
        best = 0
        for t in pools:
            buckets = self.buckets[t]
            for count in range(len(buckets) - 1, best, -1):
                if buckets[count]:
                    best = count
                    break
        return best

    def count_fitting(self, pool: str, shape: Shape, enough: int) -> int:
        """How many of the shape's workers the pool could take now (stops counting at `enough`)."""
        total = 0
        for f in self.candidates(pool, shape.gpus):
            total += f.fits(shape)
            if total >= enough:
                break
        return total
