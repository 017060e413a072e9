"""Per-cycle memo of shapes that cannot be satisfied, with dominance: bigger asks fail too."""

from __future__ import annotations

from dataclasses import dataclass, field

from hai_airflow.scheduling.capacity import Shape


@dataclass(slots=True)
class Hopeless:
    """Shapes known to fail this cycle. Valid because capacity only shrinks during a cycle, so a
    failure stays a failure, and a shape needing at least as much in no more pools fails as well."""

    known: set[Shape] = field(default_factory=set)
    records: list[tuple[frozenset[str], Shape]] = field(default_factory=list)
    cleared: dict[Shape, int] = field(default_factory=dict)
    """Shape -> how many records it was last checked against without being dominated."""

    def add(self, shape: Shape, pools: tuple[str, ...]) -> None:
        self.known.add(shape)
        self.records.append((frozenset(pools), shape))

    def holds(self, shape: Shape, pools: tuple[str, ...]) -> bool:
        """Is the shape known to fail, itself or through a smaller failed shape?"""
        if shape in self.known:
            return True
        seen = self.cleared.get(shape, 0)
        if seen == len(self.records):
            return False
        wanted = set(pools)
        for failed_pools, failed in self.records[seen:]:
            if wanted <= failed_pools and dominated(failed, shape):
                self.known.add(shape)
                return True
        self.cleared[shape] = len(self.records)
        return False


def dominated(small: Shape, big: Shape) -> bool:
    """`big` asks for at least as much as `small` in every dimension."""
    return (small.workers <= big.workers and small.gpus <= big.gpus and small.cpus <= big.cpus
            and small.memory_gb <= big.memory_gb)
