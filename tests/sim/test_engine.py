"""Hand-made traces whose outcome is known exactly, replayed through the real planner."""

from __future__ import annotations

import pytest
from sim_builders import job, node, trace

from hai_airflow.scheduling import POLICIES
from hai_airflow.scheduling.model import Admit, Quota, Snapshot, WorkerPlacement
from hai_airflow.sim import SimulationError, simulate, summarize
from hai_airflow.sim import engine as engine_module

# One 8-GPU node; a low job runs 0..10000 s, a high job arrives at 4000 s for 1000 s.
LOW_THEN_HIGH = trace(
    [node("n1")],
    [job(1).low().gpus(8).at(0).lasting(10_000), job(2).high(4).gpus(8).at(4000).lasting(1000)],
)
ELASTIC_LOW_THEN_HIGH = trace(
    [node("n1")],
    [job(1).low().elastic().gpus(8).at(0).lasting(10_000), job(2).high(4).gpus(8).at(4000).lasting(1000)],
)


@pytest.mark.parametrize(
    ("tr", "policy", "interval", "delay", "suspensions", "lost_gpu_s", "makespan", "high_wait"),
    [
        pytest.param(LOW_THEN_HIGH, "seed", 1800, 0, 1, 400 * 8, 11_400, 0,
                     id="suspends the low job, which loses 400 s since its 3600 s checkpoint"),
        pytest.param(LOW_THEN_HIGH, "least-lost-work", 1800, 0, 1, 400 * 8, 11_400, 0,
                     id="least-lost-work has the same single victim"),
        pytest.param(LOW_THEN_HIGH, "newest-first", 1800, 0, 1, 400 * 8, 11_400, 0,
                     id="newest-first has the same single victim"),
        pytest.param(LOW_THEN_HIGH, "fifo", 1800, 0, 0, 0, 11_000, 6000,
                     id="fifo never suspends: the high job waits for the low one"),
        pytest.param(LOW_THEN_HIGH, "seed", 0, 0, 1, 4000 * 8, 15_000, 0,
                     id="without checkpoints the whole run is lost"),
        pytest.param(LOW_THEN_HIGH, "seed", 1000, 0, 1, 0, 11_000, 0,
                     id="a checkpoint exactly at the suspension loses nothing"),
        pytest.param(ELASTIC_LOW_THEN_HIGH, "seed", 1800, 0, 1, 0, 11_000, 0,
                     id="an elastic job saves on suspension and loses nothing"),
        pytest.param(LOW_THEN_HIGH, "seed", 1800, 60, 1, 400 * 8, 11_460, 60,
                     id="a 60 s suspension delay holds the GPUs 60 s longer"),
    ],
)
def test_low_then_high_on_one_node(tr, policy, interval, delay, suspensions, lost_gpu_s, makespan, high_wait):
    summary = summarize(simulate(tr, policy, checkpoint_interval=interval, suspend_delay=delay))

    assert summary.jobs_finished == 2
    assert summary.suspensions == suspensions
    assert summary.lost_gpu_hours == pytest.approx(lost_gpu_s / 3600)
    assert summary.makespan_s == pytest.approx(makespan)
    assert summary.high_queue_p50_s == pytest.approx(high_wait)
    assert summary.high_within_max_schedule == 1.0


def test_a_cycle_interval_plans_only_on_timer_ticks():
    run = simulate(LOW_THEN_HIGH, "seed", checkpoint_interval=1800, cycle_interval=300)
    by_id = {o.job.id: o for o in run.outcomes}

    # The high job arrives at 4000 s and is seen at the 4200 s tick: the low job loses 600 s.
    assert (by_id[2].first_started_at, by_id[2].finished_at) == (4200, 5200)
    assert by_id[1].lost_gpu_seconds == pytest.approx(600 * 8)
    # The low job resumes at the first tick after 5200 s and needs its last 6400 s.
    assert by_id[1].finished_at == pytest.approx(5400 + 6400)
    assert len(run.cycle_seconds) == 4


def test_low_then_high_figures_are_exact():
    summary = summarize(simulate(LOW_THEN_HIGH, "seed", checkpoint_interval=1800))

    assert summary.low_queue_p50_s == 0
    # Job 2 completes after 1000 s, job 1 at 11400 s; p50 interpolates between them.
    assert summary.jct_p50_s == pytest.approx((1000 + 11_400) / 2)
    # 4000 + 1000 + 6400 s of 8 GPUs over an 11400 s makespan: never idle.
    assert summary.gpu_utilisation == pytest.approx(1.0)
    assert summary.downgraded_to_low == 0
    assert summary.high_jobs == 1
    assert summary.planner_cycles >= 3
    assert summary.jobs_per_wall_s > 0


def test_outcomes_record_each_job():
    run = simulate(LOW_THEN_HIGH, "seed", checkpoint_interval=1800)
    by_id = {o.job.id: o for o in run.outcomes}

    assert (by_id[1].first_started_at, by_id[1].finished_at, by_id[1].suspensions) == (0, 11_400, 1)
    assert (by_id[2].first_started_at, by_id[2].finished_at, by_id[2].suspensions) == (4000, 5000, 0)
    assert by_id[1].gpu_seconds == pytest.approx((4000 + 6400) * 8)


@pytest.mark.parametrize(
    ("quota", "downgraded", "suspensions", "makespan"),
    [
        pytest.param(Quota(groups={"g": 4}), 1, 0, 11_000,
                     id="over the group quota: runs as low, suspends nobody"),
        pytest.param(Quota(users={"u": 4}), 1, 0, 11_000, id="over the user quota: runs as low"),
        pytest.param(Quota(groups={"g": 8}, users={"u": 8}), 0, 1, 11_400, id="within quota: stays high"),
    ],
)
def test_high_beyond_quota_at_submission_is_downgraded(quota, downgraded, suspensions, makespan):
    tr = trace(
        [node("n1")],
        [job(1).low().gpus(8).at(0).lasting(10_000),
         job(2).high(4).of("u", "g").gpus(8).at(4000).lasting(1000)],
        quota,
    )
    summary = summarize(simulate(tr, "seed", checkpoint_interval=1800))

    assert summary.downgraded_to_low == downgraded
    assert summary.high_jobs == 1 - downgraded
    assert summary.suspensions == suspensions
    assert summary.makespan_s == pytest.approx(makespan)


def test_unfinished_high_jobs_count_against_the_quota():
    tr = trace(
        [node("n1", gpus=16)],
        [job(1).high(4).of("u", "g").gpus(8).lasting(100),
         job(2).high(4).of("u", "g").gpus(1).at(10).lasting(100),
         job(3).high(4).of("u", "g").gpus(8).at(200).lasting(100)],
        Quota(users={"u": 8}),
    )
    run = simulate(tr, "seed")

    assert {o.job.id: o.downgraded for o in run.outcomes} == {1: False, 2: True, 3: False}


def test_a_gang_waits_for_all_its_workers():
    tr = trace(
        [node("n1"), node("n2")],
        [job(1).gpus(8, workers=2).lasting(500), job(2).gpus(1).lasting(100)],
    )
    summary = summarize(simulate(tr, "seed"))

    assert summary.jobs_finished == 2
    assert summary.makespan_s == pytest.approx(600)
    assert summary.gpu_utilisation == pytest.approx((500 * 16 + 100) / (16 * 600))


@pytest.mark.parametrize(
    "impossible",
    [
        pytest.param(job(3).gpus(16).lasting(10), id="more GPUs per worker than any node has"),
        pytest.param(job(3).gpus(8, workers=3).lasting(10), id="more workers than nodes"),
    ],
)
def test_impossible_jobs_are_rejected_and_the_rest_finish(impossible):
    tr = trace([node("n1"), node("n2")], [job(1).gpus(4).lasting(50), job(2).gpus(8).lasting(70), impossible])
    summary = summarize(simulate(tr, "seed"))

    assert (summary.jobs_finished, summary.jobs_rejected, summary.jobs_unfinished) == (2, 1, 0)
    assert summary.makespan_s == pytest.approx(70)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_policy_drains_a_mixed_trace(policy):
    tr = trace(
        [node("a"), node("b", gpu_type="A100")],
        [job(i).gpus(1 + i % 8).at(i * 37 % 500).lasting(300 + i * 91 % 4000) for i in range(1, 25)]
        + [job(100 + i).high(6).gpus(4 + 4 * (i % 2)).at(200 + 400 * i).lasting(900) for i in range(6)],
    )
    summary = summarize(simulate(tr, policy, checkpoint_interval=600))

    assert summary.jobs_finished == 30
    assert 0 < summary.gpu_utilisation <= 1
    if policy == "fifo":
        assert summary.suspensions == 0


def test_a_planner_that_double_books_gpus_stops_the_simulation(monkeypatch):
    def double_booking(snapshot: Snapshot, now: float, usage: object = None) -> list[Admit]:
        return [Admit(j.id, (WorkerPlacement("n1", (0,)),), False, "test") for j in snapshot.jobs
                if j.state == "PENDING"]

    monkeypatch.setattr(engine_module, "plan", double_booking)
    tr = trace([node("n1")], [job(1).gpus(1), job(2).gpus(1)])

    with pytest.raises(SimulationError, match="not free"):
        simulate(tr, "seed")
