"""The cluster as the scheduler keeps it between cycles, changed by events, never re-read whole.

Nodes, unfinished jobs, reservations and quota, plus what the placed jobs use (`Usage`), which
each event brings up to date by difference. The server's controller applies the store's changes to
it; the simulator applies its virtual clock's events to it; both hand `snapshot()` and `usage` to `plan()`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from hai_airflow.scheduling.fairshare import FairShare
from hai_airflow.scheduling.layout import Layout
from hai_airflow.scheduling.model import Job, Node, Quota, Reservation, Snapshot
from hai_airflow.scheduling.usage import Usage
from hai_airflow.spec import PLACED

ARRIVALS_KEPT = 4096
"""New job ids a state remembers: enough for the submissions between two plans of a settled cluster."""


class ClusterState:
    """One in-memory model of the cluster; `snapshot()` is what a planning cycle sees.

    Events: `job_changed` (submitted, admitted, started, suspended, resumed, checkpointed: the job's
    new record), `job_left` (finished, cancelled, rejected, or held back by an admin), `reserved` /
    `reservation_cleared`, `quota_changed`, `nodes_changed`. An event that changes nothing (a job
    record as it was) is not counted in `events`.
    """

    def __init__(self, nodes: Sequence[Node] = (), quota: Quota | None = None, policy: str = "seed"):
        self.policy = policy
        self.quota = quota if quota is not None else Quota()
        self.jobs: dict[int, Job] = {}
        self.reservations: dict[int, tuple[Reservation, ...]] = {}
        self._reservations: tuple[Reservation, ...] | None = ()
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.usage = Usage.fresh(Layout.build(self.nodes), ())
        self.events = 0
        """How many events changed this state; an unchanged count means an unchanged cluster (`Settled`)."""
        self.arrived = 0
        """How many of those events were new jobs (a job id the state did not hold)."""
        self.arrivals: deque[int] = deque(maxlen=ARRIVALS_KEPT)
        """The ids of the latest new jobs, oldest first."""
        self.fair_share: FairShare | None = None
        """The users' recent use as last measured (`use_measured`); None: no fair-share term."""

    @classmethod
    def load(
        cls,
        nodes: Sequence[Node],
        jobs: Iterable[Job],
        reservations: Iterable[Reservation] = (),
        quota: Quota | None = None,
        policy: str = "seed",
    ) -> ClusterState:
        """The state of a fresh read (at start, on taking the lease, or to check the kept one)."""
        state = cls(nodes, quota, policy)
        for job in jobs:
            state.jobs[job.id] = job
        state.usage = Usage.fresh(state.usage.layout, (j for j in state.jobs.values() if j.state in PLACED))
        per_job: dict[int, list[Reservation]] = {}
        for r in reservations:
            per_job.setdefault(r.job_id, []).append(r)
        for job_id, rs in per_job.items():
            state.reserved(job_id, rs)
        return state

    # ---- events -----------------------------------------------------------------------------------

    def job_changed(self, job: Job) -> None:
        """A job was submitted or its record changed (state, placement, checkpoint, priority)."""
        old = self.jobs.get(job.id)
        if old == job:
            return
        self.events += 1
        if old is None:
            self.arrived += 1
            self.arrivals.append(job.id)
        self.jobs[job.id] = job
        self.usage.replace(old, job)

    def job_left(self, job_id: int) -> None:
        """A job no longer competes for GPUs: it ended, was rejected, or an admin holds it back.
        Its reservation is the store's to clear (`reservation_cleared`)."""
        old = self.jobs.pop(job_id, None)
        if old is not None:
            self.events += 1
            self.usage.replace(old, None)

    def reserved(self, job_id: int, reservations: Iterable[Reservation]) -> None:
        """GPUs are held for a waiting preemptor (replacing what was held for it before)."""
        held = tuple(reservations)
        if self.reservations.get(job_id) == held:
            return
        self.events += 1
        self.reservations[job_id] = held
        self._reservations = None

    def reservation_cleared(self, job_id: int) -> None:
        if self.reservations.pop(job_id, None) is not None:
            self.events += 1
            self._reservations = None

    def quota_changed(self, quota: Quota) -> None:
        if quota != self.quota:
            self.events += 1
            self.quota = quota

    def nodes_changed(self, nodes: Sequence[Node]) -> None:
        """Nodes were added, removed or resized: the usage is counted afresh over the new layout."""
        if tuple(nodes) == self.nodes:
            return
        self.events += 1
        self.nodes = tuple(nodes)
        placed = [j for j in self.jobs.values() if j.state in PLACED]
        self.usage = Usage.fresh(Layout.build(self.nodes), placed)

    def use_measured(self, fair_share: FairShare | None) -> None:
        """The users' recent use was measured. Not an event: it only reorders waiting low jobs, and a
        cluster that settled with jobs waiting has no room for any of them until an event comes."""
        self.fair_share = fair_share

    # ---- reading ----------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """What `plan()` sees now, with `usage` beside it; valid until the next event (plan refuses it
        with the usage after that)."""
        if self._reservations is None:
            self._reservations = tuple(r for rs in self.reservations.values() for r in rs)
        return Snapshot(
            nodes=self.nodes,
            jobs=tuple(self.jobs.values()),
            quota=self.quota,
            reservations=self._reservations,
            policy=self.policy,
            fair_share=self.fair_share,
            usage_version=self.usage.version,
        )
