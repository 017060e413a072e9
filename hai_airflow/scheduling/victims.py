"""Victim choice: which running low-priority jobs to suspend so a high-priority job can be placed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hai_airflow.scheduling.capacity import ANY, EPS, FreeCapacity, NodeFree, workers_fitting
from hai_airflow.scheduling.hopeless import Hopeless
from hai_airflow.scheduling.model import Job, Shape
from hai_airflow.scheduling.policies import Policy
from hai_airflow.spec import JobState

MAX_SET_CANDIDATES = 64
"""Bound on a victim-set search: at most this many compatible jobs are considered together."""


@dataclass(frozen=True, slots=True)
class NodeRelease:
    """What suspending a job gives back on one node."""

    node: NodeFree
    gpus: int
    cpus: float
    memory_gb: float


@dataclass(slots=True)
class Freed:
    """Resources chosen victims would give back on one node, summed."""

    gpus: int = 0
    cpus: float = 0.0
    memory_gb: float = 0.0

    def add(self, r: NodeRelease) -> None:
        self.gpus += r.gpus
        self.cpus += r.cpus
        self.memory_gb += r.memory_gb

    def remove(self, r: NodeRelease) -> None:
        self.gpus -= r.gpus
        self.cpus -= r.cpus
        self.memory_gb -= r.memory_gb


@dataclass(slots=True)
class VictimCandidates:
    """Running low-priority jobs in the policy's victim order, and what this cycle learnt about them."""

    by_pool: dict[str, list[Job]]
    """Candidates in victim order per pool they free resources in; ANY lists them all."""
    releases: dict[int, list[NodeRelease]]
    """Per candidate, what suspending it gives back, node by node."""
    widest: dict[int, int]
    """Per candidate, the most GPUs it frees on one node (bounds what it can add to a gang's room)."""
    taken: set[int] = field(default_factory=set)
    """Already chosen this cycle (their GPUs go to another preemptor)."""
    cursor: dict[Shape, int] = field(default_factory=dict)
    """Memo: per shape, the candidates before this index were found not to suffice alone since free
    capacity last grew (`hopeless.grown`). Still so: it has only shrunk since, a candidate's release
    never grows, and taken candidates are skipped anyway."""
    hopeless: Hopeless = field(default_factory=Hopeless)
    """Memo: shapes no victim or bounded victim set could make room for since free capacity last grew.

    A set search looks at the first MAX_SET_CANDIDATES candidates not taken; once others take some of
    them it would look further, and a shape kept here is not searched again until capacity grows:
    the search stays bounded per cycle, and such a job may wait one cycle more for its victims.
    """

    @classmethod
    def build(cls, jobs: Sequence[Job], cap: FreeCapacity, policy: Policy, now: float) -> VictimCandidates:
        candidates = sorted((j for j in jobs if is_candidate(j)), key=lambda j: policy.victim_key(j, now))
        releases = {j.id: releases_of(j, cap) for j in candidates}
        by_pool: dict[str, list[Job]] = {ANY: candidates}
        for j in candidates:
            for pool in dict.fromkeys(r.node.node.gpu_type for r in releases[j.id]):
                by_pool.setdefault(pool, []).append(j)
        widest = {i: max((r.gpus for r in rs), default=0) for i, rs in releases.items()}
        return cls(by_pool, releases, widest)

    def learnt_since(self, grown: int) -> None:
        """Keep the memos only if free capacity has not grown since they were learnt (`Hopeless.at`)."""
        hopeless = self.hopeless.at(grown)
        if hopeless is not self.hopeless:
            self.hopeless = hopeless
            self.cursor.clear()

    def in_order(self, pools: tuple[str, ...]) -> list[Job]:
        """The candidates worth trying for these pools, in victim order."""
        return self.by_pool.get(pools[0], []) if len(pools) == 1 else self.by_pool[ANY]


def is_candidate(job: Job) -> bool:
    """Only RUNNING low-priority jobs may be suspended (high never preempts high)."""
    return job.state == JobState.RUNNING and not job.high


def releases_of(job: Job, cap: FreeCapacity) -> list[NodeRelease]:
    """A job's resources per node, summed over its workers (nodes unknown to the snapshot skipped)."""
    per_node: dict[str, list[float]] = {}
    for w in job.placement:
        if w.node in cap.layout.ordinal:
            acc = per_node.setdefault(w.node, [0, 0.0, 0.0])
            acc[0] += len(w.gpus)
            acc[1] += w.cpus
            acc[2] += w.memory_gb
    return [NodeRelease(cap.named_node(n), int(g), c, m) for n, (g, c, m) in per_node.items()]


def in_pool(f: NodeFree, pool: str) -> bool:
    """A released node counts for a pool when it is of the pool's type and not held by the guard."""
    return not f.blocked and (pool == ANY or f.node.gpu_type == pool)


def room_gain(f: NodeFree, extra: NodeRelease | Freed, shape: Shape) -> int:
    """Workers of the shape the node gains if `extra` were given back."""
    if shape.gpus and (len(f.gpus) + extra.gpus) // shape.gpus == len(f.gpus) // shape.gpus:
        return 0  # the GPUs alone bound the gain, and they give none (the common, cheap case)
    gpus = len(f.gpus) + extra.gpus
    return workers_fitting(gpus, f.cpus + extra.cpus, f.memory_gb + extra.memory_gb, shape) - f.fits(shape)


def frees_one_worker(r: NodeRelease, shape: Shape) -> bool:
    """The release leaves room for one worker of the shape on its node."""
    f = r.node
    return (len(f.gpus) + r.gpus >= shape.gpus and f.cpus + r.cpus + EPS >= shape.cpus
            and f.memory_gb + r.memory_gb + EPS >= shape.memory_gb)


def single_victim(cap: FreeCapacity, shape: Shape, candidates: VictimCandidates, memo: bool) -> Job | None:
    """The first candidate in victim order whose suspension alone makes room for the whole gang."""
    pools = cap.pools(shape)
    allowed = None if pools == (ANY,) else set(pools)
    base = {p: cap.count_fitting(p, shape, shape.workers) for p in pools} if shape.workers > 1 else {}
    most = max(base.values(), default=0)
    start = candidates.cursor.get(shape, 0) if memo else 0
    ordered, releases, taken = candidates.in_order(pools), candidates.releases, candidates.taken
    for i in range(start, len(ordered)):
        victim = ordered[i]
        if victim.id in taken:
            continue
        if shape.workers == 1:
            # One worker: it cannot fit anywhere now, so the victim must free a whole slot on one node.
            found = any(not r.node.blocked and (allowed is None or r.node.node.gpu_type in allowed)
                        and frees_one_worker(r, shape) for r in releases[victim.id])
        elif shape.gpus and candidates.widest[victim.id] <= shape.gpus and (
            most + len(releases[victim.id]) < shape.workers
        ):
            # Freeing at most one worker's GPUs per node adds at most one worker per node.
            continue
        else:
            found = any(
                base[p] + sum(room_gain(r.node, r, shape)
                              for r in releases[victim.id] if in_pool(r.node, p)) >= shape.workers
                for p in pools
            )
        if found:
            if memo:
                candidates.cursor[shape] = i
            return victim
    if memo:
        candidates.cursor[shape] = len(ordered)
    return None


@dataclass(slots=True)
class RoomWithVictims:
    """Workers of a shape one pool could take if a set of victims were suspended.

    Counted on the side, per node the victims free, instead of giving their resources to the
    capacity in a trial: a victim set is grown and shrunk one job at a time, and recounting the
    pool's room after each step would cost a pass over the pool.
    """

    shape: Shape
    pool: str
    releases: dict[int, list[NodeRelease]]
    room: int
    """Workers the pool could take now, plus what the victims add."""
    freed: dict[int, Freed] = field(default_factory=dict)
    """Node ordinal -> what the victims free there."""

    def fits(self) -> bool:
        return self.room >= self.shape.workers

    def add(self, victim: Job) -> None:
        """Count the victim's release."""
        self.room += self._shift(victim, Freed.add)

    def without(self, victim: Job) -> None:
        """Stop counting the victim's release."""
        self.room += self._shift(victim, Freed.remove)

    def _shift(self, victim: Job, change: Callable[[Freed, NodeRelease], None]) -> int:
        """Apply `change` to what the victim frees on each node of the pool; the workers gained."""
        gained = 0
        for r in self.releases[victim.id]:
            if in_pool(r.node, self.pool):
                freed = self.freed.get(r.node.ordinal)
                if freed is None:
                    freed = self.freed[r.node.ordinal] = Freed()
                before = room_gain(r.node, freed, self.shape)
                change(freed, r)
                gained += room_gain(r.node, freed, self.shape) - before
        return gained


def victim_set(cap: FreeCapacity, shape: Shape, candidates: VictimCandidates, pool: str) -> list[Job] | None:
    """Minimal set: take candidates in victim order until the gang fits, then drop any not needed."""
    room = RoomWithVictims(shape, pool, candidates.releases, cap.count_fitting(pool, shape, shape.workers))
    chosen: list[Job] = []
    for victim in candidates.in_order((pool,)):
        if len(chosen) >= MAX_SET_CANDIDATES:
            return None
        if victim.id in candidates.taken:
            continue
        chosen.append(victim)
        room.add(victim)
        if room.fits():
            break
    else:
        return None
    # The last one added is needed; an earlier one may have become redundant. Try the least
    # preferred first, so the victims kept are the ones the policy ranks first.
    for k in range(len(chosen) - 2, -1, -1):
        room.without(chosen[k])
        if room.fits():
            del chosen[k]
        else:
            room.add(chosen[k])
    return chosen


def find_victims(
    cap: FreeCapacity, shape: Shape, candidates: VictimCandidates, memo: bool = True
) -> list[Job]:
    """Victims for a high job that cannot be placed: one job if any suffices, else a minimal set.

    `memo` is off when the job brings its own reserved GPUs (capacity is then not the shared one).
    """
    pools = cap.pools(shape)
    if memo:
        candidates.learnt_since(cap.grown)
        if candidates.hopeless.holds(shape, pools):
            return []
    single = single_victim(cap, shape, candidates, memo)
    if single is not None:
        return [single]
    for pool in pools:
        chosen = victim_set(cap, shape, candidates, pool)
        if chosen:
            return chosen
    if memo:
        candidates.hopeless.add(shape, pools)
    return []
