"""A memo of shapes that cannot be satisfied while free capacity only shrinks, with dominance:
bigger asks fail too."""

from __future__ import annotations

from dataclasses import dataclass, field

from hai_airflow.scheduling.model import Shape


@dataclass(frozen=True, slots=True)
class Failure:
    """A shape that failed, and the pools it was tried in."""

    pools: frozenset[str]
    shape: Shape


@dataclass(slots=True)
class Hopeless:
    """Shapes known to fail on the free capacity since it last grew (`FreeCapacity.grown`).

    While free capacity only shrinks a failure stays a failure, and a shape asking for at least as
    much in no more pools fails as well. When it grows (an unused reservation given back), `at`
    starts afresh.
    """

    grown: int = 0
    """The capacity's `grown` the failures were found at."""
    known: set[Shape] = field(default_factory=set)
    failures: list[Failure] = field(default_factory=list)
    cleared: dict[Shape, int] = field(default_factory=dict)
    """Shape -> how many failures it was last checked against without being dominated."""

    def at(self, grown: int) -> Hopeless:
        """This memo if it was learnt since the capacity last grew, else an empty one."""
        return self if self.grown == grown else Hopeless(grown)

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
