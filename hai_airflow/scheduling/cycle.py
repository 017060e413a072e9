"""One planning cycle's working state and the per-job steps: place, else victims, else wait."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hai_airflow.scheduling.capacity import FreeCapacity, NodeFree
from hai_airflow.scheduling.guard import Guard, fits_with_guard_nodes, node_list, raise_guard
from hai_airflow.scheduling.layout import Layout
from hai_airflow.scheduling.memo import CycleMemo, ShapeSeen, WaitReason, WaitSeen
from hai_airflow.scheduling.model import (
    Admit,
    Decision,
    Grow,
    Job,
    Placement,
    Reject,
    Reservation,
    Reserve,
    Shape,
    Shrink,
    Snapshot,
    Suspend,
    Wait,
    WorkerPlacement,
)
from hai_airflow.scheduling.placement import describe_placement, never_fits, place, shortfall
from hai_airflow.scheduling.policies import Policy
from hai_airflow.scheduling.quota import count_high, headroom, over_quota
from hai_airflow.scheduling.resize import Cut, describe_resize, find_cut, growth, resizing
from hai_airflow.scheduling.usage import Usage
from hai_airflow.scheduling.victims import VictimCandidates, find_victims
from hai_airflow.spec import LIVE, PLACED, JobState


@dataclass(frozen=True, slots=True)
class ReservedGpus:
    """A waiting job's reserved GPUs on one node that are free now."""

    node: NodeFree
    gpus: list[int]


@dataclass(slots=True)
class Cycle:
    """Everything one cycle learns as it walks the queue; built from, and never writing to, the snapshot."""

    snapshot: Snapshot
    policy: Policy
    now: float
    cap: FreeCapacity
    layout: Layout
    placed: list[Job]
    user_used: dict[str, int]
    group_used: dict[str, int]
    own_free: dict[int, dict[str, list[int]]]
    """Per waiting job, its reserved GPUs that are free now (kept out of everyone else's reach)."""
    own_holders: dict[int, list[Job]]
    """Per waiting job, the jobs still placed some of its reserved GPUs."""
    precounted: set[int] = field(default_factory=set)
    """Waiting jobs whose GPUs are already in the quota usage (they hold a reservation)."""
    candidates: VictimCandidates | None = None
    """Victim candidates, sorted only once a high job first needs them (most cycles never do)."""
    guard: Guard | None = None
    decisions: list[Decision] = field(default_factory=list)
    waited: int = 0
    high_waiting: bool = False
    """A high-priority job waits for GPUs: no resizable job grows this cycle (it would be shrunk back)."""
    learnt: CycleMemo = field(default_factory=lambda: CycleMemo(0))
    """What the cycle learnt since free capacity last grew; read it through `memo`."""

    @classmethod
    def start(
        cls, snapshot: Snapshot, policy: Policy, now: float, waiting: list[Job], usage: Usage | None
    ) -> Cycle:
        """Free capacity = nodes minus what placed jobs use minus GPUs reserved for `waiting` jobs."""
        placed = [j for j in snapshot.jobs if j.state in PLACED]
        if usage is None:
            usage = Usage.fresh(Layout.build(snapshot.nodes), placed)
        elif usage.version != snapshot.usage_version:
            raise ValueError("the cluster state changed after this snapshot was taken; take a new one")
        layout = usage.layout
        cap = FreeCapacity.build(usage)
        reservations = (
            honoured(snapshot.reservations, keeps_reservation(waiting, placed).__contains__, layout)
            if snapshot.reservations else []
        )
        holder_of = gpu_holders(cap, placed, reservations) if reservations else {}
        own_free = set_aside(cap, reservations)
        own_holders: dict[int, list[Job]] = {}
        for r in reservations:
            for g in r.gpus:
                holder = holder_of.get((r.node, g))
                if holder is not None and holder not in own_holders.setdefault(r.job_id, []):
                    own_holders[r.job_id].append(holder)
        # A job with a reservation already has GPUs set aside (victims were suspended for it), so
        # it counts against quota like a running job; otherwise others could use up the quota first.
        reserving = [j for j in waiting if j.id in own_free or j.id in own_holders] if reservations else []
        cycle = cls(snapshot, policy, now, cap, layout, placed, dict(usage.user_high),
                    dict(usage.group_high), own_free, own_holders)
        for job in reserving:
            cycle.count_quota(job)
        cycle.precounted = {j.id for j in reserving}
        return cycle

    @property
    def victims(self) -> VictimCandidates:
        if self.candidates is None:
            self.candidates = VictimCandidates.build(self.placed, self.cap, self.policy, self.now)
        return self.candidates

    def memo(self) -> CycleMemo:
        """What the cycle learnt, started afresh once free capacity has grown since (`CycleMemo`)."""
        if self.learnt.grown != self.cap.grown:
            self.learnt = CycleMemo(self.cap.grown)
        return self.learnt

    # ---- the steps for one waiting job, in order -------------------------------------------------

    def decide(self, job: Job) -> None:
        """Reject, else quota, else place, else wait for own victims, else new victims, else wait."""
        shape = job.shape
        shapes = self.memo().shapes
        seen = shapes.get(shape)
        if seen is None:
            seen = shapes[shape] = ShapeSeen(never_fits(self.layout.kinds, shape))
        if seen.rejected is not None:
            self.decisions.append(Reject(job.id, seen.rejected))
            return
        high = job.high
        if high:
            own = job.total_gpus if job.id in self.precounted else 0
            over = over_quota(job.user, job.group, job.total_gpus, self.user_used.get(job.user, 0) - own,
                              self.group_used.get(job.group, 0) - own, self.snapshot.quota)
            if over is not None:
                self.wait(job, WaitReason(over))
                return
        plain = job.id not in self.own_free and job.id not in self.own_holders
        if plain:
            # A job without a reservation of the same shape and class waited while free capacity
            # was as it is now (same version). What `seek` reads besides the capacity moves only
            # with it: victims are taken and the guard is raised by changes to the capacity, and a
            # wait that raised the guard is not kept. So `seek` would make this job wait for the
            # same reason.
            last = seen.waits.get(high)
            if last is not None and last.version == self.cap.version:
                self.high_waiting |= high
                self.wait(job, last.why)
                return
        why = self.seek(job, shape, high)
        if why is not None:
            if plain and why.same_for_its_shape:
                seen.waits[high] = WaitSeen(self.cap.version, why)
            self.wait(job, why)

    def seek(self, job: Job, shape: Shape, high: bool) -> WaitReason | None:
        """Admit or preempt for the job; else say why it waits (and if that holds for its shape)."""
        reserved = job.id in self.own_free
        placement, how = self.place_reserved(job, shape) if reserved else (place(self.cap, shape), "")
        if placement is not None:
            self.admit(job, placement, how)
            return None
        if job.id in self.own_holders:
            holders = self.own_holders[job.id]
            return WaitReason(waiting_for(holders), holders[0].id, same_for_its_shape=False)
        if high and self.policy.preempts and self.preempt(job, shape, reserved):
            return None
        if self.guard is not None and fits_with_guard_nodes(self.cap, self.guard, shape):
            return WaitReason(self.guard.reason(), self.guard.job_id)
        self.high_waiting |= high
        reason = shortfall(self.cap, shape) + drained_note(self.cap, shape)
        if high and self.policy.preempts:
            reason += "; suspending running low-priority jobs would not make room"
        if self.guard is None and (high or self.policy.guards_any_job):
            self.guard = raise_guard(self.cap, job.id, shape)
            if self.guard is not None:
                return WaitReason(f"{reason}; nodes {self.guard.text} are kept for it (starvation guard)",
                            same_for_its_shape=False)
        return WaitReason(reason)

    def place_reserved(self, job: Job, shape: Shape) -> tuple[Placement | None, str]:
        """A job with a reservation goes onto its reserved GPUs when they suffice, else anywhere it fits
        (sooner is better than waiting for the rest of its victims)."""
        own = [ReservedGpus(self.cap.named_node(n), gpus) for n, gpus in self.own_free[job.id].items()]
        with self.cap.trial() as trial:
            for r in own:
                self.cap.give(r.node, r.gpus, 0, 0)
            placement, how = on_reserved(self.cap, shape, own), "on its reserved GPUs"
            if placement is None:
                placement, how = place(self.cap, shape), ""
            if placement is None:
                return None, ""
            # Admitted: the reserved GPUs it does not use are free for the jobs after it.
            trial.commit()
        del self.own_free[job.id]
        return placement, how

    def preempt(self, job: Job, shape: Shape, reserved: bool) -> bool:
        """Shrink a resizable job if that alone makes room, else suspend the chosen victims; reserve
        the preemptor's placement on what they free."""
        memo = None if reserved else self.memo()
        candidates = self.victims
        if candidates.resizable and (memo is None or not memo.no_victims.holds(shape, self.cap.pools(shape))):
            cut = find_cut(self.cap, shape, candidates.resizable, candidates.taken)
            if cut is not None:
                return self.shrink(job, shape, cut)
        victims = find_victims(self.cap, shape, candidates, memo)
        placement = self.place_after_suspending(victims, shape) if victims else None
        if placement is None:
            return False
        self.victims.taken.update(v.id for v in victims)
        rule = self.policy.victim_rule if len(victims) == 1 else (
            f"no single job frees enough; fewest jobs in order: {self.policy.victim_rule}")
        for v in victims:
            self.decisions.append(Suspend(v.id, job.id, f"suspended so high-priority job {job.id} "
                                                        f"can run ({rule})"))
        ids = ", ".join(str(v.id) for v in victims)
        self.decisions.append(Reserve(job.id, placement,
                                      f"GPUs freed by suspending job{'s' * (len(victims) > 1)} {ids} "
                                      f"are held for job {job.id}: {describe_placement(placement)}"))
        self.count_quota(job)
        self.wait(job, WaitReason(waiting_for(victims), victims[0].id))
        return True

    def shrink(self, job: Job, shape: Shape, cut: Cut) -> bool:
        """Restart the cut's job on the workers it keeps; the preemptor gets what the others free."""
        with self.cap.trial() as trial:
            self.cap.release_workers(cut.freed)
            placement = place(self.cap, shape)
            if placement is None:
                return False
            trial.commit_without_gains()
        victim, to = cut.job, len(cut.kept)
        self.victims.taken.add(victim.id)
        self.decisions.append(Shrink(victim.id, to, cut.kept, job.id,
                                     f"shrunk to {describe_resize(victim, to)} so high-priority job {job.id} "
                                     f"can run (giving up workers loses less than a suspension)"))
        self.decisions.append(Reserve(job.id, placement,
                                      f"GPUs freed by shrinking job {victim.id} are held for job {job.id}: "
                                      f"{describe_placement(placement)}"))
        self.count_quota(job)
        self.wait(job, WaitReason(f"waiting for job {victim.id} to shrink to {to} workers", victim.id))
        return True

    def grow(self, job: Job) -> None:
        """A running resizable job below its size takes free GPUs in its pool (as many workers as fit),
        unless a high-priority job waits (it would shrink the job straight back) or it was picked as
        a victim earlier this cycle."""
        if self.high_waiting or (self.candidates is not None and job.id in self.candidates.taken):
            return  # a victim this cycle is being shrunk or suspended, not grown
        most = job.max_workers - job.workers
        if job.high:
            room = headroom(job.user, job.group, self.user_used.get(job.user, 0),
                            self.group_used.get(job.group, 0), self.snapshot.quota)
            most = most if room is None else min(most, room // job.gpus_per_worker)
        with self.cap.trial() as trial:
            extra = growth(self.cap, job, most)
            if extra is None:
                return
            trial.commit()
        more = len(extra) * job.gpus_per_worker
        if job.high:
            self.user_used[job.user] = self.user_used.get(job.user, 0) + more
            self.group_used[job.group] = self.group_used.get(job.group, 0) + more
        to = job.workers + len(extra)
        where = describe_placement(extra)
        self.decisions.append(Grow(job.id, to, job.placement + extra,
                                   f"grows to {describe_resize(job, to)} on free GPUs: {where}"))

    def place_after_suspending(self, victims: list[Job], shape: Shape) -> Placement | None:
        """Place as if the victims were gone; what they free beyond the placement stays held this cycle
        (they are still suspending, and their GPUs are the preemptor's, not the next job's)."""
        with self.cap.trial() as trial:
            for v in victims:
                self.cap.release(v)
            placement = place(self.cap, shape)
            if placement is not None:
                trial.commit_without_gains()
        return placement

    # ---- decisions ------------------------------------------------------------------------------

    def admit(self, job: Job, placement: Placement, how: str) -> None:
        """Start (or resume) the job on the placement; it counts against quota from now on."""
        verb = "resumes" if job.state == JobState.SUSPENDED else "starts"
        where = describe_placement(placement)
        self.decisions.append(Admit(job.id, placement, job.state == JobState.SUSPENDED,
                                    f"{verb} on {where}{' ' + how if how else ''}"))
        self.count_quota(job)

    def count_quota(self, job: Job) -> None:
        """An admitted or reserved high job counts against its user's and group's quota at once."""
        if job.id not in self.precounted:
            count_high(self.user_used, self.group_used, job)

    def wait(self, job: Job, why: WaitReason) -> None:
        """The job waits; its position counts waiting jobs from 1 in queue order."""
        self.waited += 1
        self.decisions.append(Wait(job.id, why.reason, self.waited, why.blocked_by))


def honoured(
    reservations: Iterable[Reservation], waiting: Callable[[int], bool], layout: Layout
) -> list[Reservation]:
    """The reservations a cycle keeps GPUs for: those of waiting jobs, on nodes the cluster still has
    and has not drained (a preemptor is placed elsewhere rather than on a drained node)."""
    ordinal, nodes = layout.ordinal, layout.nodes
    return [
        r for r in reservations
        if waiting(r.job_id) and r.node in ordinal and not nodes[ordinal[r.node]].drained
    ]


def set_aside(cap: FreeCapacity, reservations: list[Reservation]) -> dict[int, dict[str, list[int]]]:
    """Take the free GPUs of waiting jobs' reservations out of the shared capacity (marking their
    nodes as carrying one): per job, per node, the GPUs set aside for it."""
    own_free: dict[int, dict[str, list[int]]] = {}
    for r in reservations:
        f = cap.named_node(r.node)
        f.reserved = True
        free = [g for g in dict.fromkeys(r.gpus) if g in f.gpus]
        cap.take(f, free, 0, 0)
        own_free.setdefault(r.job_id, {}).setdefault(r.node, []).extend(free)
    return own_free


def gpu_holders(
    cap: FreeCapacity, placed: list[Job], reservations: list[Reservation]
) -> dict[tuple[str, int], Job]:
    """Who holds each reserved GPU: the placed job with the lowest id placed on it (bad GPU indices
    skipped), whatever order the snapshot lists the jobs in."""
    nodes = cap.layout.nodes
    ordinal = cap.layout.ordinal
    wanted = {(r.node, g) for r in reservations for g in r.gpus if 0 <= g < nodes[ordinal[r.node]].gpus}
    named = {n for n, _ in wanted}
    holder_of: dict[tuple[str, int], Job] = {}
    for job in sorted(placed, key=lambda j: j.id):
        for w in job.placement:
            if w.node in named:
                for g in w.gpus:
                    if (w.node, g) in wanted and (w.node, g) not in holder_of:
                        holder_of[(w.node, g)] = job
    return holder_of


def on_reserved(cap: FreeCapacity, shape: Shape, own: list[ReservedGpus]) -> Placement | None:
    """Gang placement using only the job's reserved GPUs (lowest first); None when they do not suffice."""
    if shape.gpus == 0:
        return None
    allowed = set(cap.pools(shape))
    taken: list[WorkerPlacement] = []
    with cap.trial() as trial:
        for _ in range(shape.workers):
            for r in own:
                f = r.node
                free = [g for g in r.gpus if g in f.gpus]
                if f.node.gpu_type in allowed and f.fits(shape) and len(free) >= shape.gpus:
                    w = WorkerPlacement(f.node.name, tuple(free[: shape.gpus]), shape.cpus, shape.memory_gb)
                    cap.take(f, w.gpus, w.cpus, w.memory_gb)
                    taken.append(w)
                    allowed = {f.node.gpu_type}  # one GPU type for the whole gang
                    break
            else:
                return None
        trial.commit()
    return tuple(taken)


def drained_note(cap: FreeCapacity, shape: Shape) -> str:
    """`; node n2 has room but is drained`, naming the drained nodes that could take a worker now."""
    drained = cap.drained_with_room(shape)
    if not drained:
        return ""
    if len(drained) == 1:
        return f"; node {drained[0].node.name} has room but is drained"
    return f"; nodes {node_list(drained)} have room but are drained"


def keeps_reservation(waiting: list[Job], placed: list[Job]) -> set[int]:
    """The jobs whose reservations hold: waiting ones, and those stopping to restart at a new size."""
    return {j.id for j in waiting} | {j.id for j in placed if resizing(j)}


def waiting_for(holders: list[Job]) -> str:
    """Wait reason of a preemptor whose GPUs are still being freed."""
    ids = ", ".join(str(h.id) for h in holders)
    plural = "s" if len(holders) > 1 else ""
    if all(h.resizable and h.workers < len(h.placement) for h in holders):
        return f"waiting for job{plural} {ids} to shrink"
    suspending = all(h.state in LIVE and not h.high for h in holders)
    verb = "suspend" if suspending else "release its GPUs" if len(holders) == 1 else "release their GPUs"
    return f"waiting for job{plural} {ids} to {verb}"
