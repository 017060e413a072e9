"""What one planning cycle learns about shapes on its free capacity, kept until that capacity grows."""

from __future__ import annotations

from dataclasses import dataclass, field

from hai_airflow.scheduling.model import Shape


@dataclass(frozen=True, slots=True)
class WaitReason:
    """Why a job waits: the reason, the job it waits for, and whether every job of its shape and
    class would wait for the same reason while free capacity stays as it is."""

    reason: str
    blocked_by: int | None = None
    same_for_its_shape: bool = True


@dataclass(frozen=True, slots=True)
class WaitSeen:
    """A plain wait and the capacity version it was decided at."""

    version: int
    why: WaitReason


@dataclass(slots=True)
class ShapeSeen:
    """What the cycle knows of one shape: why it can never fit on this cluster (None: it can; a
    question about the nodes alone, `placement.never_fits`), and per class (high or not) the last
    plain wait of a job of that shape."""

    rejected: str | None
    waits: dict[bool, WaitSeen] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Failure:
    """A shape that failed, and the pools it was tried in."""

    pools: frozenset[str]
    shape: Shape


@dataclass(slots=True)
class Hopeless:
    """Shapes that failed, with dominance: a shape asking for at least as much as a failed one, in no
    more pools, fails as well (true while free capacity only shrinks)."""

    known: set[Shape] = field(default_factory=set)
    failures: list[Failure] = field(default_factory=list)
    cleared: dict[Shape, int] = field(default_factory=dict)
    """Shape -> how many failures it was last checked against without being dominated."""

    def add(self, shape: Shape, pools: tuple[str, ...]) -> None:
        self.known.add(shape)
        self.failures.append(Failure(frozenset(pools), shape))

    def holds(self, shape: Shape, pools: tuple[str, ...]) -> bool:
        """Is the shape known to fail, itself or through a smaller failed shape?"""
        if shape in self.known:
            return True
        seen = self.cleared.get(shape, 0)
        if seen == len(self.failures):
            return False
        wanted = set(pools)
        for failure in self.failures[seen:]:
            if wanted <= failure.pools and dominated(failure.shape, shape):
                self.known.add(shape)
                return True
        self.cleared[shape] = len(self.failures)
        return False


def dominated(small: Shape, big: Shape) -> bool:
    """`big` asks for at least as much as `small` in every dimension."""
    return (small.workers <= big.workers and small.gpus <= big.gpus and small.cpus <= big.cpus
            and small.memory_gb <= big.memory_gb)


@dataclass(slots=True)
class CycleMemo:
    """What a cycle has learnt while free capacity has not grown; `Cycle.memo` starts a new one as
    soon as it has (`FreeCapacity.grown`: reserved GPUs a job did not use, given back).

    The one rule: everything here was learnt outside trials at capacity growth `grown`, and goes
    with it. Until the next growth free capacity only shrinks (placements, blocks, victims' GPUs
    held for their preemptor), so a shape no victims made room for still finds none, and a candidate
    that did not make room alone still does not. A wait reason quotes free figures, which move with
    every change, so it is reused only at the very capacity `version` it was decided at (an undone
    trial puts the version back: asking a question is not a change).

    Each part is here because `benchmarks/plan_bench.py` needs it: at 1,000 nodes x 10,000 queued a
    plan takes 59 ms of CPU with all of it (stateless, least of 7 cycles, median of 3 runs); each
    field says what it takes without that part. Not kept, as no benchmark showed a saving: the
    shapes that found no placement (plan_bench and the simulator's 10,000-job trace the same within
    noise without it) and the guard nodes' room per shape (plan_bench the same within noise; that
    question is a trial now).
    """

    grown: int
    shapes: dict[Shape, ShapeSeen] = field(default_factory=dict)
    """Per shape met: whether it never fits (about the nodes alone: dropped with the rest, it is only
    counted again), and its last plain wait per class. A long queue behind
    a full cluster costs one lookup per job instead of a placement attempt, a victim search and a
    shortfall text each: 157 ms without it, 137 ms without the waits alone."""
    no_victims: Hopeless = field(default_factory=Hopeless)
    """Shapes no single victim nor bounded victim set made room for (`victims.find_victims`): 67 ms
    without it.

    Also a rule, not only a saving: a set search looks at the first MAX_SET_CANDIDATES candidates not
    taken; once others take some of them it would look further, and a shape kept here is not searched
    again until capacity grows. The search stays bounded per cycle; such a job may wait one cycle
    more for its victims (without it the decisions differ).
    """
    victims_tried: dict[Shape, int] = field(default_factory=dict)
    """Per shape, the candidates before this index in its victim order were found not to make room
    alone (`victims.single_victim`); taken candidates are passed over anyway. 85 ms without it."""
