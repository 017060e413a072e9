"""What the placed jobs use: free resources per node and high-priority GPUs per user and group.

Built once from the placed jobs (`fresh`), then kept up to date job by job (`replace`) by the
cluster state between cycles; a planning cycle only reads it. Either way the counts are what a fresh
count over all placed jobs gives (a property test compares both ways).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from dataclasses import dataclass, field

from hai_airflow.scheduling.layout import Layout
from hai_airflow.scheduling.model import Job
from hai_airflow.scheduling.quota import count_high
from hai_airflow.spec import PLACED

NodeFreeBase = tuple[tuple[int, ...], float, float]
"""Free GPU indices (ascending), CPUs and memory of a node with something in use."""

Share = tuple[tuple[int, ...], float, float]
"""GPU indices, CPUs and memory that one job's workers use on one node."""


@dataclass(slots=True)
class Usage:
    """Per-node use of the placed jobs, as free resources and as the free-capacity index's buckets.

    Read-only for a cycle: `FreeCapacity` copies what it changes, the cycle copies the quota counts.
    """

    layout: Layout
    jobs: dict[int, Job] = field(default_factory=dict)
    """Job id -> placed job counted here."""
    shares: dict[int, dict[int, Share]] = field(default_factory=dict)
    """Node ordinal -> job id -> that job's share of the node."""
    free: dict[int, NodeFreeBase] = field(default_factory=dict)
    """Node ordinal -> free resources, for the nodes with something in use (the others are all free)."""
    buckets: dict[str, list[list[int]]] = field(default_factory=dict)
    """Per GPU type, per free-GPU count, the ordinals of the nodes with that many free, ascending."""
    user_high: dict[str, int] = field(default_factory=dict)
    group_high: dict[str, int] = field(default_factory=dict)
    """GPUs of the holding high-priority jobs, per user and per group."""
    version: int = 0
    """Bumped by every change, so a snapshot can tell that the usage it was taken with has moved on."""

    @classmethod
    def fresh(cls, layout: Layout, holding: Iterable[Job]) -> Usage:
        """Count every placed job, then list every node in its bucket."""
        usage = cls(layout)
        for job in holding:
            usage.jobs[job.id] = job
            count_high(usage.user_high, usage.group_high, job)
            for i, share in usage._shares_of(job).items():
                usage.shares.setdefault(i, {})[job.id] = share
        usage.buckets = {t: [[] for _ in lists] for t, lists in layout.empty.items()}
        for i, node in enumerate(layout.nodes):
            base = usage._recount(i) if i in usage.shares else None
            count = node.gpus if base is None else len(base[0])
            usage.buckets[node.gpu_type][count].append(i)
        return usage

    def replace(self, old: Job | None, new: Job | None) -> None:
        """A job's record changed from `old` to `new` (None: not known / gone); count the difference."""
        gone = [old] if old is not None and old.state in PLACED else []
        added = [new] if new is not None and new.state in PLACED else []
        if gone and added and same_use(gone[0], added[0]):
            self.jobs[added[0].id] = added[0]
            return
        self.update(gone, added)

    def update(self, gone: Iterable[Job], new: Iterable[Job]) -> None:
        """Take away what `gone` jobs used and add what `new` ones use."""
        touched: set[int] = set()
        for job in gone:
            del self.jobs[job.id]
            count_high(self.user_high, self.group_high, job, -1)
            for i in self._nodes_of(job):
                del self.shares[i][job.id]
                touched.add(i)
        for job in new:
            self.jobs[job.id] = job
            count_high(self.user_high, self.group_high, job)
            for i, share in self._shares_of(job).items():
                self.shares.setdefault(i, {})[job.id] = share
                touched.add(i)
        for i in touched:
            self._refresh(i)
        self.version += 1

    def _nodes_of(self, job: Job) -> set[int]:
        ordinal = self.layout.ordinal
        return {ordinal[w.node] for w in job.placement if w.node in ordinal}

    def _shares_of(self, job: Job) -> dict[int, Share]:
        """The job's workers summed per node (nodes unknown to the layout skipped)."""
        ordinal = self.layout.ordinal
        if len(job.placement) == 1:
            # The common case, without summing workers per node.
            w = job.placement[0]
            i = ordinal.get(w.node)
            return {} if i is None else {i: (w.gpus, w.cpus, w.memory_gb)}
        per_node: dict[int, Share] = {}
        for w in job.placement:
            i = ordinal.get(w.node)
            if i is None:
                continue
            gpus, cpus, memory_gb = per_node.get(i, ((), 0.0, 0.0))
            per_node[i] = ((*gpus, *w.gpus), cpus + w.cpus, memory_gb + w.memory_gb)
        return per_node

    def _recount(self, i: int) -> NodeFreeBase | None:
        """Node `i`'s free resources from its shares (None when nothing is in use; bad GPU indices
        are ignored)."""
        shares = self.shares.get(i)
        if not shares:
            self.shares.pop(i, None)
            self.free.pop(i, None)
            return None
        node = self.layout.nodes[i]
        used: set[int] = set()
        cpus = memory_gb = 0.0
        for gpus, c, m in shares.values():
            used.update(gpus)
            cpus += c
            memory_gb += m
        free = tuple(g for g in range(node.gpus) if g not in used)
        base = (free, node.cpus - cpus, node.memory_gb - memory_gb)
        self.free[i] = base
        return base

    def _refresh(self, i: int) -> None:
        """Recount node `i` and move it to the bucket of its new free-GPU count."""
        node = self.layout.nodes[i]
        before = len(self.free[i][0]) if i in self.free else node.gpus
        base = self._recount(i)
        after = node.gpus if base is None else len(base[0])
        if after != before:
            buckets = self.buckets[node.gpu_type]
            old = buckets[before]
            del old[bisect_left(old, i)]
            insort(buckets[after], i)


def same_use(a: Job, b: Job) -> bool:
    """Two records of a placed job that count the same (e.g. only a checkpoint time moved)."""
    return (a.placement == b.placement and a.max_schedule == b.max_schedule and a.user == b.user
            and a.group == b.group and a.total_gpus == b.total_gpus)
