"""When planning again would decide nothing new: after a plan that only made jobs wait, until the
next event that could change a decision (or REPLAN_SECONDS, for what moves with time alone)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import islice

from hai_airflow.scheduling.capacity import FreeCapacity
from hai_airflow.scheduling.cycle import honoured, set_aside
from hai_airflow.scheduling.model import Decision, Job, Wait
from hai_airflow.scheduling.placement import never_fits, place
from hai_airflow.scheduling.policies import POLICIES
from hai_airflow.scheduling.state import ClusterState
from hai_airflow.spec import WAITING, JobState

REPLAN_SECONDS = 10.0
"""A settled cluster is planned again at least this often, for what time alone moves: the order of
low jobs under the seed weight (waiting and suspension time grow at different rates) and of victims
under least-lost-work (GPU-seconds grow with each victim's size). Either changes which job waits at
which position, or which victims a preemptor would pick; neither makes room where the last plan found
none, so a job may start later than it could by at most this long only in that corner. It is also
how long a new job that waits anyway (`waits_anyway`) keeps the reason it was submitted with."""


@dataclass(frozen=True, slots=True)
class Settled:
    """The cluster as a plan that decided only waits left it: the state's event and arrival counts
    then, and when.

    With no event since, the nodes, jobs, reservations and quota are the ones that plan saw. It placed
    nothing and reserved nothing, so every job met the same free capacity, and the jobs that raise
    the starvation guard (high ones, or any under fifo) come in an order time does not change: the
    same plan again would make the same jobs wait for the same reasons. The same holds after events
    that are only new jobs that wait anyway (`waits_anyway`): the plan would add their waits and
    move the positions of the jobs queued behind them, nothing else.
    """

    events: int
    at: float
    arrived: int = 0

    @classmethod
    def after(cls, decisions: Sequence[Decision], state: ClusterState, now: float) -> Settled | None:
        """The plan's decisions, made over `state` as it is now: settled if each one is a Wait."""
        if all(isinstance(d, Wait) for d in decisions):
            return cls(state.events, now, state.arrived)
        return None

    def holds(self, state: ClusterState, now: float) -> Settled | None:
        """Still settled at `now`: this, moved past the new jobs since if each waits anyway; None
        when a plan is due (another event, or REPLAN_SECONDS passed)."""
        if now - self.at >= REPLAN_SECONDS:
            return None
        if state.events == self.events:
            return self
        new = state.arrived - self.arrived
        if new != state.events - self.events or new > len(state.arrivals):
            return None  # something else changed too, or more jobs came than the state remembers
        # With every event since an arrival, each of these jobs is still as it came.
        arrivals = [state.jobs[job_id] for job_id in islice(reversed(state.arrivals), new)]
        if not waits_anyway(state, arrivals):
            return None
        return replace(self, events=state.events, arrived=state.arrived)


def waits_anyway(state: ClusterState, arrivals: Sequence[Job]) -> bool:
    """Would a plan over `state` make each of these new jobs wait without changing anything for
    the others, if a plan of waits only is what the state without them got?

    True when each is low priority and pending, the policy raises the starvation guard for high jobs
    only, and its shape can be placed neither on the free capacity a cycle starts from (placed jobs
    and waiting jobs' reservations taken out, as in `Cycle.start`) nor never: a plan of waits leaves
    that capacity as it found it, so the new job meets it whenever its turn comes, waits, raises no
    guard and takes nothing from the jobs behind it. Costs what the cluster's nodes and reservations
    cost, not the queue: the kept usage already counts the placed jobs.
    """
    policy = POLICIES[state.policy]
    if policy.guards_any_job:
        return False
    if any(j.state != JobState.PENDING or j.high for j in arrivals):
        return False
    usage, jobs = state.usage, state.jobs
    cap = FreeCapacity.build(usage)
    reservations = (r for rs in state.reservations.values() for r in rs)

    def waiting(job_id: int) -> bool:
        return (j := jobs.get(job_id)) is not None and j.state in WAITING

    set_aside(cap, honoured(reservations, waiting, usage.layout))
    for job in arrivals:
        shape = job.shape
        if never_fits(usage.layout.kinds, shape) is not None or place(cap, shape) is not None:
            return False
    return True
