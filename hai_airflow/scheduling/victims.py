"""Victim choice: which running low-priority jobs to suspend so a high-priority job can be placed.

Whether suspending jobs makes room is asked one way: release them in a trial on the free capacity,
ask `FreeCapacity.fits`, undo (Kueue's remove, fits, restore).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice

from hai_airflow.scheduling.capacity import ANY, FreeCapacity, NodeFree
from hai_airflow.scheduling.memo import CycleMemo
from hai_airflow.scheduling.model import Job, Shape
from hai_airflow.scheduling.policies import Policy
from hai_airflow.spec import JobState

MAX_SET_CANDIDATES = 64
"""Bound on a victim-set search: at most this many compatible jobs are considered together."""


@dataclass(frozen=True, slots=True)
class FreedGpus:
    """How many GPUs suspending a job gives back on one node."""

    node: NodeFree
    gpus: int

    def workers_gained(self, per: int) -> int:
        """Workers of `per` GPUs each that the node's free GPUs would hold more with these back."""
        have = len(self.node.gpus)
        return (have + self.gpus) // per - have // per


@dataclass(slots=True)
class VictimCandidates:
    """Running low-priority jobs in the policy's victim order."""

    by_pool: dict[str, list[Job]]
    """Candidates in victim order per pool they free resources in; ANY lists them all."""
    freed: dict[int, list[FreedGpus]]
    """Per candidate, the nodes it runs on and how many GPUs it frees on each."""
    taken: set[int] = field(default_factory=set)
    """Already chosen this cycle (their GPUs go to another preemptor)."""
    resizable: list[Job] = field(default_factory=list)
    """The resizable candidates, in victim order: shrinking one is tried before any suspension."""

    @classmethod
    def build(cls, jobs: Sequence[Job], cap: FreeCapacity, policy: Policy, now: float) -> VictimCandidates:
        candidates = sorted((j for j in jobs if is_candidate(j)), key=lambda j: policy.victim_key(j, now))
        freed = {j.id: gpus_freed(j, cap) for j in candidates}
        by_pool: dict[str, list[Job]] = {ANY: candidates}
        for j in candidates:
            for pool in dict.fromkeys(r.node.node.gpu_type for r in freed[j.id]):
                by_pool.setdefault(pool, []).append(j)
        return cls(by_pool, freed, resizable=[j for j in candidates if j.resizable])

    def in_order(self, pools: tuple[str, ...]) -> list[Job]:
        """The candidates worth trying for these pools, in victim order."""
        return self.by_pool.get(pools[0], []) if len(pools) == 1 else self.by_pool[ANY]


def is_candidate(job: Job) -> bool:
    """Only RUNNING low-priority jobs may be suspended (high never preempts high)."""
    return job.state == JobState.RUNNING and not job.high


def gpus_freed(job: Job, cap: FreeCapacity) -> list[FreedGpus]:
    """A job's GPUs per node, summed over its workers (nodes unknown to the snapshot skipped)."""
    per_node: dict[str, int] = {}
    for w in job.placement:
        if w.node in cap.layout.ordinal:
            per_node[w.node] = per_node.get(w.node, 0) + len(w.gpus)
    return [FreedGpus(cap.named_node(n), g) for n, g in per_node.items()]


def makes_room(cap: FreeCapacity, shape: Shape, victims: Sequence[Job]) -> bool:
    """Would the whole gang fit if these jobs were suspended? Asked in a trial, always undone."""
    with cap.trial():
        for v in victims:
            cap.release(v)
        return cap.fits(shape)


def worth_a_trial(shape: Shape, gpu_room: dict[str, int], freed: list[FreedGpus]) -> bool:
    """Counted by GPUs alone, which bound what fits, could these GPUs (one entry per node) complete
    the gang in a pool (`gpu_room`: the workers each pool's free GPUs hold now)? False spares a trial.

    A GPU job only: a CPU job is never high priority, so it never looks for victims.
    """
    per = shape.gpus
    if len(freed) == 1:  # the common case, without a sum per pool
        r = freed[0]
        room = gpu_room.get(r.node.node.gpu_type)
        return room is not None and not r.node.blocked and room + r.workers_gained(per) >= shape.workers
    gained: dict[str, int] = {}
    for r in freed:
        pool = r.node.node.gpu_type
        if not r.node.blocked and pool in gpu_room:
            gained[pool] = gained.get(pool, 0) + r.workers_gained(per)
    return any(gpu_room[pool] + more >= shape.workers for pool, more in gained.items())


def together(victims: Iterable[Job], candidates: VictimCandidates) -> list[FreedGpus]:
    """The GPUs these victims free, summed per node."""
    per_node: dict[int, FreedGpus] = {}
    for v in victims:
        for r in candidates.freed[v.id]:
            had = per_node.get(r.node.ordinal)
            per_node[r.node.ordinal] = r if had is None else FreedGpus(r.node, had.gpus + r.gpus)
    return list(per_node.values())


def single_victim(
    cap: FreeCapacity, shape: Shape, candidates: VictimCandidates, memo: CycleMemo | None
) -> Job | None:
    """The first candidate in victim order whose suspension alone makes room for the whole gang."""
    pools = cap.pools(shape)
    gpu_room = {p: cap.gpu_room(p, shape) for p in pools}
    ordered, freed, taken = candidates.in_order(pools), candidates.freed, candidates.taken
    start = memo.victims_tried.get(shape, 0) if memo is not None else 0
    for i in range(start, len(ordered)):
        victim = ordered[i]
        if victim.id not in taken and worth_a_trial(shape, gpu_room, freed[victim.id]) and (
            makes_room(cap, shape, (victim,))
        ):
            if memo is not None:
                memo.victims_tried[shape] = i
            return victim
    if memo is not None:
        memo.victims_tried[shape] = len(ordered)
    return None


def victim_set(cap: FreeCapacity, shape: Shape, candidates: VictimCandidates, pool: str) -> list[Job] | None:
    """Minimal set: suspend candidates in victim order until the gang fits in the pool, then keep
    running any not needed (all in a trial, undone). Only the first MAX_SET_CANDIDATES candidates
    not taken are considered."""
    pools = (pool,)
    untaken = (v for v in candidates.in_order(pools) if v.id not in candidates.taken)
    window = list(islice(untaken, MAX_SET_CANDIDATES))
    if not worth_a_trial(shape, {pool: cap.gpu_room(pool, shape)}, together(window, candidates)):
        return None
    with cap.trial():
        for n, victim in enumerate(window, 1):
            cap.release(victim)
            if cap.fits(shape, pools):
                chosen = window[:n]
                break
        else:
            return None
        # The last one added is needed; an earlier one may have become redundant. Try the least
        # preferred first, so the victims kept are the ones the policy ranks first. One on nodes
        # that hold no worker of the shape even now adds nothing the gang uses: putting it back
        # cannot change the answer, so it goes back without a trial.
        for k in range(len(chosen) - 2, -1, -1):
            if not any(r.node.fits(shape) for r in candidates.freed[chosen[k].id]):
                cap.occupy(chosen[k])
                del chosen[k]
                continue
            with cap.trial() as kept_running:
                cap.occupy(chosen[k])
                if cap.fits(shape, pools):
                    kept_running.commit()
                    del chosen[k]
    return chosen


def find_victims(
    cap: FreeCapacity, shape: Shape, candidates: VictimCandidates, memo: CycleMemo | None
) -> list[Job]:
    """Victims for a high job that cannot be placed: one job if any suffices, else a minimal set.

    `memo` is None for a job that holds a reservation: its search is not a plain job's, so it
    neither reads nor adds to what the plain jobs' searches learnt.
    """
    pools = cap.pools(shape)
    if memo is not None and memo.no_victims.holds(shape, pools):
        return []
    single = single_victim(cap, shape, candidates, memo)
    if single is not None:
        return [single]
    for pool in pools:
        chosen = victim_set(cap, shape, candidates, pool)
        if chosen:
            return chosen
    if memo is not None:
        memo.no_victims.add(shape, pools)
    return []
