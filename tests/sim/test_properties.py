"""Invariants of any replay: nothing double-booked, work conserved, fifo never suspends."""

from __future__ import annotations

import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_builders import job, node, trace

import hai_airflow.sim.engine
from hai_airflow.scheduling import POLICIES, plan
from hai_airflow.scheduling.model import Decision, Quota, Snapshot
from hai_airflow.scheduling.usage import Usage
from hai_airflow.sim import simulate, summarize

jobs = st.lists(
    st.tuples(
        st.integers(0, 2000),  # submit time
        st.integers(1, 3000),  # duration
        st.sampled_from([(1, 1), (1, 2), (1, 4), (1, 8), (2, 8)]),  # workers, GPUs per worker
        st.sampled_from([0, 0, 4, 24]),  # max_schedule
        st.booleans(),  # elastic
        st.sampled_from(["a", "b"]),  # user (group = user)
    ),
    min_size=1,
    max_size=14,
)


@pytest.mark.parametrize("policy", list(POLICIES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=jobs, interval=st.sampled_from([0, 500, 1800]))
def test_every_job_finishes_and_gpu_time_adds_up(policy, rows, interval):
    tr = trace(
        [node("n1"), node("n2"), node("n3", gpu_type="A100")],
        [job(i).at(t).lasting(d).gpus(g, workers=w).max_schedule(ms).elastic(e).of(u, u)
         for i, (t, d, (w, g), ms, e, u) in enumerate(rows, start=1)],
        Quota(groups={"a": 8}),
    )

    run = simulate(tr, policy, checkpoint_interval=interval)
    summary = summarize(run)

    assert summary.jobs_finished == len(rows)
    for o in run.outcomes:
        useful = o.job.duration * o.job.total_gpus
        # Allocated GPU time = the job's own work plus exactly what suspensions threw away.
        assert o.gpu_seconds == pytest.approx(useful + o.lost_gpu_seconds)
        if o.job.elastic:
            assert o.lost_gpu_seconds == 0
    assert summary.gpu_utilisation <= 1 + 1e-9
    if policy == "fifo":
        assert summary.suspensions == 0


def fresh_plan(snapshot: Snapshot, now: float) -> list[Decision]:
    """`plan` in a new thread, counting the usage from the snapshot's jobs, not the kept one."""
    out: list[list[Decision]] = []
    worker = threading.Thread(target=lambda: out.append(plan(snapshot, now)))
    worker.start()
    worker.join()
    return out[0]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 3000),
            st.integers(1, 3000),
            st.sampled_from([(1, 1), (1, 2), (1, 4), (2, 4), (3, 2)]),
            st.sampled_from([0, 0, 4]),
            st.sampled_from([(0, 0), (0.1, 0.3), (0.7, 1.1), (30, 200)]),  # CPUs, GB per worker
        ),
        min_size=1,
        max_size=40,
    ),
    policy=st.sampled_from(list(POLICIES)),
)
def test_cycles_that_update_the_last_count_decide_as_a_fresh_count(monkeypatch, rows, policy):
    # The planner keeps the last cycle's per-node use and updates it by the jobs that changed;
    # every cycle of a replay must decide exactly what a planner counting from nothing decides.
    cycles = []

    def both(snapshot: Snapshot, now: float, usage: Usage | None = None) -> list[Decision]:
        assert usage is not None, "the simulator hands its kept usage to plan"
        decided = plan(snapshot, now, usage)
        assert decided == fresh_plan(snapshot, now), f"t={now}"
        cycles.append(now)
        return decided

    monkeypatch.setattr(hai_airflow.sim.engine, "plan", both)
    tr = trace(
        [node("n1", gpus=4), node("n2", gpus=4), node("n3", gpus=8, gpu_type="A100")],
        [job(i).at(t).lasting(d).gpus(g, workers=w).max_schedule(ms).using(c, m).of("a", "a")
         for i, (t, d, (w, g), ms, (c, m)) in enumerate(rows, start=1)],
        Quota(groups={"a": 6}),
    )
    simulate(tr, policy)
    assert cycles
