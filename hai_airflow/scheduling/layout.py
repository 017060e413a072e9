"""What the scheduler knows of the nodes alone: built once per set of nodes, read by every cycle."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hai_airflow.scheduling.model import Node

NodeKinds = dict[str, dict[tuple[int, float, float], int]]
"""GPU type -> (gpus, cpus, memory_gb) of a node -> how many such nodes: the cluster when empty."""


@dataclass(frozen=True, slots=True, eq=False)
class Layout:
    """The nodes' GPU types, their positions by name, their sizes, and the empty cluster's buckets."""

    nodes: Sequence[Node]
    types: tuple[str, ...]
    ordinal: dict[str, int]
    """Node name -> position in `nodes` (names are unique: the store and the trace loader enforce it)."""
    empty: dict[str, list[list[int]]]
    """Per GPU type, per free-GPU count, the ordinals of the nodes with that many GPUs when all are free."""
    kinds: NodeKinds
    """Drained nodes count here: a drain is for a while, so a job that fits only there waits, never
    is rejected."""
    drained: tuple[int, ...] = ()
    """Ordinals of the drained nodes, ascending."""

    @classmethod
    def build(cls, nodes: Sequence[Node]) -> Layout:
        types = tuple(sorted({n.gpu_type for n in nodes}))
        top = max((n.gpus for n in nodes), default=0)
        empty: dict[str, list[list[int]]] = {t: [[] for _ in range(top + 1)] for t in types}
        for i, n in enumerate(nodes):
            empty[n.gpu_type][n.gpus].append(i)
        ordinal = {n.name: i for i, n in enumerate(nodes)}
        drained = tuple(i for i, n in enumerate(nodes) if n.drained)
        return cls(nodes, types, ordinal, empty, node_kinds(nodes), drained)


def node_kinds(nodes: Sequence[Node]) -> NodeKinds:
    """Group nodes by type and size, so empty-cluster questions cost per kind, not per node."""
    kinds: NodeKinds = {}
    for n in nodes:
        sizes = kinds.setdefault(n.gpu_type, {})
        key = (n.gpus, n.cpus, n.memory_gb)
        sizes[key] = sizes.get(key, 0) + 1
    return kinds
