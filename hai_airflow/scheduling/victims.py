"""Victim choice: which running low-priority jobs to suspend so a high-priority job can be placed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hai_airflow.scheduling.capacity import ANY, EPS, FreeCapacity, NodeFree, Shape, workers_fitting
from hai_airflow.scheduling.hopeless import Hopeless
from hai_airflow.scheduling.model import Job
from hai_airflow.scheduling.policies import Policy

MAX_SET_CANDIDATES = 64
"""Bound on a victim-set search: at most this many compatible jobs are considered together."""

Release = tuple[NodeFree, int, float, float]
"""What suspending a job gives back on one node: GPUs, CPUs, memory."""


@dataclass(slots=True)
class VictimPool:
    """Running low-priority jobs in the policy's victim order, and what this cycle learnt about them."""

    by_pool: dict[str, list[Job]]
    """Candidates in victim order per pool they free resources in; ANY lists them all."""
    releases: dict[int, list[Release]]
    widest: dict[int, int]
    """Per candidate, the most GPUs it frees on one node (bounds what it can add to a gang's room)."""
    taken: set[int] = field(default_factory=set)
    """Already chosen this cycle (their GPUs go to another preemptor)."""
    cursor: dict[Shape, int] = field(default_factory=dict)
    """Per shape, candidates before this index are known not to suffice alone (capacity only shrinks)."""
    hopeless: Hopeless = field(default_factory=Hopeless)
    """Shapes no victim or bounded victim set can make room for, this cycle."""

    @classmethod
    def build(cls, jobs: Sequence[Job], cap: FreeCapacity, policy: Policy, now: float) -> VictimPool:
        candidates = sorted((j for j in jobs if is_candidate(j)), key=lambda j: policy.victim_key(j, now))
        releases = {j.id: releases_of(j, cap) for j in candidates}
        by_pool: dict[str, list[Job]] = {ANY: candidates}
        for j in candidates:
            for pool in dict.fromkeys(f.node.gpu_type for f, *_ in releases[j.id]):
                by_pool.setdefault(pool, []).append(j)
        widest = {i: max((g for _, g, _, _ in r), default=0) for i, r in releases.items()}
        return cls(by_pool, releases, widest)

    def in_order(self, pools: tuple[str, ...]) -> list[Job]:
        """The candidates worth trying for these pools, in victim order."""
        return self.by_pool.get(pools[0], []) if len(pools) == 1 else self.by_pool[ANY]


def is_candidate(job: Job) -> bool:
    """Only RUNNING low-priority jobs may be suspended (high never preempts high)."""
    return job.state == "RUNNING" and job.max_schedule == 0


def releases_of(job: Job, cap: FreeCapacity) -> list[Release]:
    """A job's resources per node, summed over its workers (nodes unknown to the snapshot skipped)."""
    per_node: dict[str, list[float]] = {}
    for w in job.placement:
        if w.node in cap.layout.ordinal:
            acc = per_node.setdefault(w.node, [0, 0.0, 0.0])
            acc[0] += len(w.gpus)
            acc[1] += w.cpus
            acc[2] += w.memory_gb
    return [(cap.named_node(n), int(g), c, m) for n, (g, c, m) in per_node.items()]


def in_pool(f: NodeFree, pool: str) -> bool:
    """A released node counts for a pool when it is of the pool's type and not held by the guard."""
    return not f.blocked and (pool == ANY or f.node.gpu_type == pool)


def room_gain(f: NodeFree, extra: Sequence[float], shape: Shape) -> int:
    """Workers of the shape the node gains if `extra` (GPUs, CPUs, memory) were given back."""
    if shape.gpus and (len(f.gpus) + int(extra[0])) // shape.gpus == len(f.gpus) // shape.gpus:
        return 0  # the GPUs alone bound the gain, and they give none (the common, cheap case)
    after = workers_fitting(len(f.gpus) + int(extra[0]), f.cpus + extra[1], f.memory_gb + extra[2], shape)
    return after - f.fits(shape)


def frees_one_worker(f: NodeFree, g: int, c: float, m: float, shape: Shape) -> bool:
    """Giving back (g, c, m) on this node leaves room for one worker of the shape."""
    return (len(f.gpus) + g >= shape.gpus and f.cpus + c + EPS >= shape.cpus
            and f.memory_gb + m + EPS >= shape.memory_gb)


def single_victim(cap: FreeCapacity, shape: Shape, pool_of: VictimPool, memo: bool) -> Job | None:
    """The first candidate in victim order whose suspension alone makes room for the whole gang."""
    pools = cap.pools(shape)
    allowed = None if pools == (ANY,) else set(pools)
    base = {p: cap.count_fitting(p, shape, shape.workers) for p in pools} if shape.workers > 1 else {}
    most = max(base.values(), default=0)
    start = pool_of.cursor.get(shape, 0) if memo else 0
    candidates, releases, taken = pool_of.in_order(pools), pool_of.releases, pool_of.taken
    for i in range(start, len(candidates)):
        victim = candidates[i]
        if victim.id in taken:
            continue
        if shape.workers == 1:
            # One worker: it cannot fit anywhere now, so the victim must free a whole slot on one node.
            found = any(not f.blocked and (allowed is None or f.node.gpu_type in allowed)
                        and frees_one_worker(f, g, c, m, shape) for f, g, c, m in releases[victim.id])
        elif shape.gpus and pool_of.widest[victim.id] <= shape.gpus and (
            most + len(releases[victim.id]) < shape.workers
        ):
            # Freeing at most one worker's GPUs per node adds at most one worker per node.
            continue
        else:
            found = any(
                base[p] + sum(room_gain(f, (g, c, m), shape)
                              for f, g, c, m in releases[victim.id] if in_pool(f, p)) >= shape.workers
                for p in pools
            )
        if found:
            if memo:
                pool_of.cursor[shape] = i
            return victim
    if memo:
        pool_of.cursor[shape] = len(candidates)
    return None


def victim_set(cap: FreeCapacity, shape: Shape, pool_of: VictimPool, pool: str) -> list[Job] | None:
    """Minimal set: take candidates in victim order until the gang fits, then drop any not needed."""
    room = cap.count_fitting(pool, shape, shape.workers)
    extra: dict[int, list[float]] = {}
    chosen: list[Job] = []

    def add(victim: Job, sign: int) -> int:
        gained = 0
        for f, g, c, m in pool_of.releases[victim.id]:
            if in_pool(f, pool):
                acc = extra.setdefault(f.ordinal, [0.0, 0.0, 0.0])
                before = room_gain(f, acc, shape)
                acc[0] += sign * g
                acc[1] += sign * c
                acc[2] += sign * m
                gained += room_gain(f, acc, shape) - before
        return gained

    for victim in pool_of.in_order((pool,)):
        if len(chosen) >= MAX_SET_CANDIDATES:
            return None
        if victim.id in pool_of.taken:
            continue
        chosen.append(victim)
        room += add(victim, +1)
        if room >= shape.workers:
            break
    else:
        return None
    # The last one added is needed; an earlier one may have become redundant. Try the least
    # preferred first, so the victims kept are the ones the policy ranks first.
    for k in range(len(chosen) - 2, -1, -1):
        lost = add(chosen[k], -1)
        if room + lost >= shape.workers:
            room += lost
            del chosen[k]
        else:
            add(chosen[k], +1)
    return chosen


def find_victims(cap: FreeCapacity, shape: Shape, pool_of: VictimPool, memo: bool = True) -> list[Job]:
    """Victims for a high job that cannot be placed: one job if any suffices, else a minimal set.

    `memo` is off when the job brings its own reserved GPUs (capacity is then not the shared one).
    """
    pools = cap.pools(shape)
    if memo and pool_of.hopeless.holds(shape, pools):
        return []
    single = single_victim(cap, shape, pool_of, memo)
    if single is not None:
        return [single]
    for pool in pools:
        chosen = victim_set(cap, shape, pool_of, pool)
        if chosen:
            return chosen
    if memo:
        pool_of.hopeless.add(shape, pools)
    return []
