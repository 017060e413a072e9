"""The scheduling cycle: `plan(snapshot, now)` turns a snapshot into decisions, purely."""

from __future__ import annotations

from itertools import repeat

from hai_airflow.scheduling.cycle import Cycle
from hai_airflow.scheduling.model import Decision, Snapshot
from hai_airflow.scheduling.policies import POLICIES
from hai_airflow.scheduling.resize import can_grow
from hai_airflow.scheduling.usage import Usage
from hai_airflow.spec import WAITING, JobState


def plan(snapshot: Snapshot, now: float, usage: Usage | None = None) -> list[Decision]:
    """One scheduling cycle. Pure: no I/O, no clock, no randomness; the snapshot is not modified.

    1. snapshot -> free-capacity index (placed jobs and live reservations subtracted);
    2. order the waiting queue (PENDING and SUSPENDED jobs) by the snapshot's policy, low jobs with
       the fair-share term of the snapshot's `fair_share` (the users' recent use) when it has one;
    3. for each head, in order: Reject if it can never fit; Wait if high priority would break
       quota; Admit if it can be placed (a reservation first); Wait while its own victims suspend;
       Suspend victims + Reserve (high jobs only); else Wait, raising the starvation guard for the
       first high job (any job under fifo) that cannot be placed even with preemption; before
       suspending anything for a high job, Shrink a resizable job by whole workers if that alone
       makes room; a running resizable job below its size takes its turn in the queue order to Grow
       on free GPUs (none while a high job waits for GPUs);
    4. return the decisions, in queue order.

    `usage` is what the placed jobs use as the cluster state keeps it (`ClusterState.usage`), taken
    with the snapshot; without it the cycle counts it from the snapshot's jobs. Read, never written.

    Every waiting job gets exactly one of Admit, Wait or Reject; Suspend and Reserve come just
    before the preemptor's Wait. Wait.position counts waiting jobs from 1 in queue order.
    """
    policy = POLICIES.get(snapshot.policy)
    if policy is None:
        raise ValueError(f"unknown scheduling policy {snapshot.policy!r}; choose one of {sorted(POLICIES)}")
    waiting = [j for j in snapshot.jobs if j.state in WAITING]
    growing = [j for j in snapshot.jobs if j.state == JobState.RUNNING and can_grow(j, now)]
    if not waiting and not growing:
        return []
    cycle = Cycle.start(snapshot, policy, now, waiting, usage)
    queue = waiting + growing if growing else waiting
    fair = snapshot.fair_share
    keys = list(map(policy.queue_key, queue, repeat(now), repeat(fair)))  # each ends with the id: no ties
    for i in sorted(range(len(queue)), key=keys.__getitem__):
        job = queue[i]
        if job.state == JobState.RUNNING:
            cycle.grow(job)
        else:
            cycle.decide(job)
    return cycle.decisions
