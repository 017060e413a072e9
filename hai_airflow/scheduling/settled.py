"""When planning again would decide nothing new: after a plan that only made jobs wait, until the
next event (or REPLAN_SECONDS, for what moves with time alone)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hai_airflow.scheduling.model import Decision, Wait

REPLAN_SECONDS = 10.0
"""A settled cluster is planned again at least this often, for what time alone moves: the order of
low jobs under the seed weight (waiting and suspension time grow at different rates) and of victims
under least-lost-work (GPU-seconds grow with each victim's size). Either changes which job waits at
which position, or which victims a preemptor would pick; neither makes room where the last plan found
none, so a job may start later than it could by at most this long only in that corner."""


@dataclass(frozen=True, slots=True)
class Settled:
    """The cluster as a plan that decided only waits left it: the state's event count then, and when.

    With no event since, the nodes, jobs, reservations and quota are the ones that plan saw. It placed
    nothing and reserved nothing, so every job met the same free capacity, and the jobs that raise
    the starvation guard (high ones, or any under fifo) come in an order time does not change: the
    same plan again would make the same jobs wait for the same reasons.
    """

    events: int
    at: float

    @classmethod
    def after(cls, decisions: Sequence[Decision], events: int, now: float) -> Settled | None:
        """The plan's decisions, made over a state at `events`: settled if each one is a Wait."""
        if all(isinstance(d, Wait) for d in decisions):
            return cls(events, now)
        return None

    def holds(self, events: int, now: float) -> bool:
        """Is the cluster still as planned: no event since, and not yet time to look again?"""
        return events == self.events and now - self.at < REPLAN_SECONDS
