"""Free capacity during one cycle: per-node free resources indexed by GPU type and free-GPU count."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from hai_airflow.scheduling.layout import Layout
from hai_airflow.scheduling.model import Job, Node, Shape, WorkerPlacement
from hai_airflow.scheduling.usage import NodeFreeBase, Usage

EPS = 1e-9
"""Slack for float CPU/memory sums, so 0.1 + 0.2 CPUs still fit on 0.3."""

ANY = "*"
"""Pool name for CPU-only workers: they may go on any node."""


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
    """No placement and no victims here this cycle: drained by an admin, or held by the starvation
    guard."""
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
    """Names the free capacity as it is: a new value on every change, and the old one back when a
    trial is undone (the capacity is then exactly as before). A figure derived from the capacity holds
    while this is the same."""
    changes: int = 0
    """Changes ever made, undone ones included: where `version` takes its next value from, so a value
    never names two different capacities."""
    grown: int = 0
    """Bumped when free capacity grows for good: a `give` outside any trial, or a trial that gave
    committed with its gains. Between two bumps free capacity only shrinks (takes, blocks, trials
    undone or committed without gains), so what failed stays failed: the cycle's memo
    (`memo.CycleMemo`) holds for one value of this. It is learnt outside trials only: undoing one
    gives back what it took."""
    open_trial: Trial | None = None
    """The innermost trial in progress; every change is recorded in it."""

    @classmethod
    def build(cls, usage: Usage) -> FreeCapacity:
        """The index at the start of a cycle: the nodes minus what the placed jobs use, drained
        nodes blocked."""
        buckets = {t: [list(b) for b in lists] for t, lists in usage.buckets.items()}
        cap = cls(usage.layout, usage.free, buckets)
        for i in usage.layout.drained:
            cap.block(cap.node(i))
        return cap

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

    def trial(self) -> Trial:
        """Start a trial: changes from now on are undone unless it is committed (see `Trial`)."""
        self.open_trial = Trial(self, self.open_trial, self.version)
        return self.open_trial

    def _unlist(self, f: NodeFree) -> None:
        if not f.blocked:
            bucket = self.buckets[f.node.gpu_type][len(f.gpus)]
            del bucket[bisect_left(bucket, f.ordinal)]

    def _changing(self, f: NodeFree) -> None:
        """Before a change: let the open trial save the node, and take it out of its bucket."""
        trial = self.open_trial
        if trial is not None and f.ordinal not in trial.saved:
            trial.saved[f.ordinal] = SavedNode(f, tuple(f.gpus), f.cpus, f.memory_gb, f.blocked)
        self._unlist(f)

    def _changed(self, f: NodeFree) -> None:
        """After a change: list the node in the bucket of its free GPUs, and name the new capacity."""
        if not f.blocked:
            insort(self.buckets[f.node.gpu_type][len(f.gpus)], f.ordinal)
        self.changes += 1
        self.version = self.changes

    def take(self, f: NodeFree, gpus: Sequence[int], cpus: float, memory_gb: float) -> None:
        """Use these GPUs (which must be free) and this much CPU and memory on the node."""
        self._changing(f)
        for g in gpus:
            f.gpus.remove(g)
        f.cpus -= cpus
        f.memory_gb -= memory_gb
        self._changed(f)

    def give(self, f: NodeFree, gpus: Sequence[int], cpus: float, memory_gb: float) -> None:
        """Return GPUs, CPU and memory to the node (what a suspended job or an unused reservation frees)."""
        if self.open_trial is None:
            self.grown += 1
        else:
            self.open_trial.gave = True
        self._changing(f)
        for g in gpus:
            insort(f.gpus, g)
        f.cpus += cpus
        f.memory_gb += memory_gb
        self._changed(f)

    def release(self, job: Job) -> None:
        """Give back what the placed job uses, as its suspension would."""
        self.release_workers(job.placement)

    def release_workers(self, workers: Sequence[WorkerPlacement]) -> None:
        """Give back what these workers use, as a suspension or a shrink would (nodes the snapshot
        does not have skipped)."""
        for w in workers:
            f = self.named(w.node)
            if f is not None:
                self.give(f, w.gpus, w.cpus, w.memory_gb)

    def occupy(self, job: Job) -> None:
        """Use again what the placed job uses, undoing its `release` (a victim kept running)."""
        for w in job.placement:
            f = self.named(w.node)
            if f is not None:
                self.take(f, w.gpus, w.cpus, w.memory_gb)

    def restrict(self, f: NodeFree, gpus: Sequence[int], cpus: float, memory_gb: float) -> None:
        """Set the node's free resources outright."""
        self._changing(f)
        f.gpus = sorted(gpus)
        f.cpus, f.memory_gb = cpus, memory_gb
        self._changed(f)

    def block(self, f: NodeFree) -> None:
        """Take the node out of placement for the rest of the cycle (starvation guard)."""
        self._changing(f)
        f.blocked = True
        self._changed(f)

    def unblock(self, f: NodeFree) -> None:
        """Open a blocked node to placement again (in a trial: what would fit without the block)."""
        self._changing(f)
        f.blocked = False
        self._changed(f)

    def _put_back(self, saved: SavedNode) -> None:
        """Undo: the node exactly as a trial found it (not recorded: the trial is closing)."""
        f = saved.node
        self._unlist(f)
        f.gpus, f.cpus, f.memory_gb, f.blocked = list(saved.gpus), saved.cpus, saved.memory_gb, saved.blocked
        self._changed(f)

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

    def drained_with_room(self, shape: Shape) -> list[NodeFree]:
        """Drained nodes of the shape's pools with room for one of its workers now."""
        pools = self.pools(shape)
        found = (self.node(i) for i in self.layout.drained)
        return [f for f in found if (ANY in pools or f.node.gpu_type in pools) and f.fits(shape)]

    def fits(self, shape: Shape, pools: Sequence[str] | None = None) -> bool:
        """The one question of whether something fits: could every worker of the shape be placed now,
        all in one of its pools (or of `pools`)? `placement.place` finds the nodes when it can."""
        enough = shape.workers
        for pool in self.pools(shape) if pools is None else pools:
            if shape.gpus and self.gpu_room(pool, shape) < enough:
                continue  # too few free GPUs, whatever the CPU and memory: no pass over the nodes
            if self.count_fitting(pool, shape, enough) >= enough:
                return True
        return False

    def gpu_room(self, pool: str, shape: Shape) -> int:
        """Workers of the shape the pool's free GPUs alone could hold (CPU and memory aside): never
        less than what fits. The shape asks for GPUs."""
        per = shape.gpus
        buckets = self.buckets[pool]
        room = 0
        for count in range(per, len(buckets)):
            if buckets[count]:
                room += len(buckets[count]) * (count // per)
        return room

    def count_fitting(self, pool: str, shape: Shape, enough: int) -> int:
        """How many of the shape's workers the pool could take now (stops counting at `enough`)."""
        total = 0
        for f in self.candidates(pool, shape.gpus):
            total += f.fits(shape)
            if total >= enough:
                break
        return total


@dataclass(slots=True)
class SavedNode:
    """A node's free resources as a trial found them: what undoing the trial puts back.

    Not frozen: a trial makes one per node it changes, and a frozen dataclass takes three times as
    long to make. Nothing changes one after it is made.
    """

    node: NodeFree
    gpus: tuple[int, ...]
    cpus: float
    memory_gb: float
    blocked: bool


@dataclass(slots=True)
class Trial:
    """A tentative change to free capacity: try a placement or a victim set, then `commit` or `undo`.

    Every change made on the capacity while the trial is open belongs to it. The trial saves each
    node the first time it changes it, and `undo` puts the saved nodes back, which is undoing the
    changes in reverse order: afterwards the capacity is exactly as the trial found it (no float
    drift from giving back what was taken), its `version` included. Leaving a `with` block undoes a
    trial that was not committed. Trials nest: committing an inner trial hands its changes to the
    one around it, which may still undo them.

    It is the cycle's one way to ask whether something would fit if things were otherwise: change
    the capacity (release victims, open the guard's nodes, place), ask `FreeCapacity.fits`, undo.

        with cap.trial() as trial:
            placement = ...  # takes and gives on cap
            if placement is not None:
                trial.commit()
    """

    cap: FreeCapacity
    outer: Trial | None
    version: int
    """The capacity's version when the trial began: its version again once the trial is undone."""
    saved: dict[int, SavedNode] = field(default_factory=dict)
    """Node ordinal -> the node before this trial first changed it."""
    gave: bool = False
    """Something was given back during the trial: committing it grows free capacity."""
    closed: bool = False

    def __enter__(self) -> Trial:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.closed:
            self.undo()

    def commit(self) -> None:
        """Keep every change (an outer trial may still undo them)."""
        self._close()
        if self.outer is not None:
            for i, saved in self.saved.items():
                self.outer.saved.setdefault(i, saved)
            self.outer.gave |= self.gave
        elif self.gave:
            self.cap.grown += 1

    def commit_without_gains(self) -> None:
        """Keep what was taken, not what was given: no node ends with more free than the trial found.

        Used to place a preemptor as if its victims were gone: the placement uses what they free
        first, and what they free beyond it stays out of everyone's reach for the rest of the cycle.
        """
        cap = self.cap
        for saved in self.saved.values():
            f = saved.node
            cap.restrict(f, [g for g in f.gpus if g in saved.gpus], min(f.cpus, saved.cpus),
                         min(f.memory_gb, saved.memory_gb))
        self.gave = False
        self.commit()

    def undo(self) -> None:
        """Put every node this trial changed back as it found it."""
        self._close()
        for saved in self.saved.values():
            self.cap._put_back(saved)
        self.cap.version = self.version

    def _close(self) -> None:
        if self.closed:
            raise RuntimeError("this trial was already committed or undone")
        if self.cap.open_trial is not self:
            raise RuntimeError("a trial started inside this one is still open")
        self.closed = True
        self.cap.open_trial = self.outer
