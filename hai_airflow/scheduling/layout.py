"""What a cycle knows of the nodes alone: the same for every cycle over the same node tuple."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hai_airflow.scheduling.model import Node

if TYPE_CHECKING:
    from hai_airflow.scheduling.capacity import Shape

NodeKinds = dict[str, dict[tuple[int, float, float], int]]
"""GPU type -> (gpus, cpus, memory_gb) of a node -> how many such nodes: the cluster when empty."""

_last = threading.local()


@dataclass(frozen=True, slots=True, eq=False)
class Layout:
    """The nodes' GPU types, their positions by name, their sizes, and the empty cluster's buckets.

    Nodes do not change between cycles (a simulation, or a server between config reloads), so the
    layout of the last node tuple seen by this thread is kept and handed out again while the very
    same tuple comes back. Tuples and `Node`s are immutable, so that is the same answer a fresh
    build gives.
    """

    nodes: Sequence[Node]
    types: tuple[str, ...]
    ordinal: dict[str, int]
    """Node name -> position in `nodes` (names are unique: the store and the trace loader enforce it)."""
    empty: dict[str, list[list[int]]]
    """Per GPU type, per free-GPU count, the ordinals of the nodes with that many GPUs when all are free."""
    kinds: NodeKinds
    never_fits: dict[Shape, str | None] = field(default_factory=dict)
    """Shape -> why it cannot fit even on the empty cluster, else None: a memo of a question about
    the nodes alone, so it lasts as long as the layout."""

    @classmethod
    def of(cls, nodes: Sequence[Node]) -> Layout:
        last: Layout | None = getattr(_last, "layout", None)
        if last is not None and last.nodes is nodes:
            return last
        layout = cls.build(nodes)
        if isinstance(nodes, tuple):
            # Only an immutable sequence may be recognised by identity next time.
            _last.layout = layout
        return layout

    @classmethod
    def build(cls, nodes: Sequence[Node]) -> Layout:
        types = tuple(sorted({n.gpu_type for n in nodes}))
        top = max((n.gpus for n in nodes), default=0)
        empty: dict[str, list[list[int]]] = {t: [[] for _ in range(top + 1)] for t in types}
        for i, n in enumerate(nodes):
            empty[n.gpu_type][n.gpus].append(i)
        ordinal = {n.name: i for i, n in enumerate(nodes)}
        return cls(nodes, types, ordinal, empty, node_kinds(nodes))


def node_kinds(nodes: Sequence[Node]) -> NodeKinds:
    """Group nodes by type and size, so empty-cluster questions cost per kind, not per node."""
    kinds: NodeKinds = {}
    for n in nodes:
        sizes = kinds.setdefault(n.gpu_type, {})
        key = (n.gpus, n.cpus, n.memory_gb)
        sizes[key] = sizes.get(key, 0) + 1
    return kinds
