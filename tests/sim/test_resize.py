"""Resizable jobs in the simulator: the `min_workers` column, `--resizable-share`, and Shrink/Grow applied."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_builders import JOB_HEADER, NODE_HEADER, job, node, trace, write_csv
from typer.testing import CliRunner

from hai_airflow.cli.sim import sim
from hai_airflow.scheduling import POLICIES
from hai_airflow.scheduling.model import (
    Admit,
    Decision,
    Grow,
    Quota,
    Reserve,
    Shrink,
    Snapshot,
    WorkerPlacement,
)
from hai_airflow.scheduling.usage import Usage
from hai_airflow.sim import SimulationError, TraceError, load_jobs, simulate, summarize, with_resizable_share
from hai_airflow.sim import engine as engine_module
from hai_airflow.sim.engine import Simulator
from hai_airflow.spec import JobState

# ---- the trace column -------------------------------------------------------------------------


def _jobs_csv(tmp_path, rows: list[list[object]], extra: Sequence[str] = ("elastic", "min_workers")):
    return write_csv(tmp_path / "JOBS.csv", [*JOB_HEADER, *extra], rows)


def test_min_workers_makes_a_distributed_job_resizable_and_elastic(tmp_path):
    path = _jobs_csv(tmp_path, [
        [1, 0, 10, 4, 8, "", 0, "", "", "", "", "", 2],
        [2, 0, 10, 4, 8, "", 0, "", "", "", "", "true", 4],
        [3, 0, 10, 4, 8, "", 0, "", "", "", "", "false", ""],
    ])
    first, second, third = load_jobs(path)

    assert (first.min_workers, first.resizable, first.elastic) == (2, True, True)
    # min_workers = workers is valid but never resizes (as the platform's spec).
    assert (second.min_workers, second.resizable) == (4, False)
    assert (third.min_workers, third.resizable, third.elastic) == (None, False, False)


@pytest.mark.parametrize(
    ("row", "column", "message"),
    [
        ([1, 0, 10, 4, 8, "", 0, "", "", "", "", "", 5], "min_workers", "5 is more than workers (4)"),
        ([1, 0, 10, 4, 8, "", 0, "", "", "", "", "", 0], "min_workers", "'0' is not an integer >= 1"),
        ([1, 0, 10, 4, 8, "", 0, "", "", "", "", "", "two"], "min_workers", "'two' is not an integer"),
        ([1, 0, 10, 1, 8, "", 0, "", "", "", "", "", 1], "min_workers", "only a job of several GPU workers"),
        ([1, 0, 10, 4, 0, "", 0, "", "", "", "", "", 2], "min_workers", "only a job of several GPU workers"),
        ([1, 0, 10, 4, 8, "", 0, "", "", "", "", "false", 2], "elastic", "a resizable job (min_workers)"),
    ],
)
def test_a_bad_min_workers_names_the_line_and_column(tmp_path, row, column, message):
    with pytest.raises(TraceError, match="line 2") as caught:
        load_jobs(_jobs_csv(tmp_path, [row]))

    assert caught.value.column == column
    assert message in str(caught.value)


# ---- --resizable-share ------------------------------------------------------------------------

MIXED = trace(
    [node("n1"), node("n2")],
    [job(i).gpus(4, workers=2 + i % 3).at(i) for i in range(1, 41)]
    + [job(100).gpus(8).at(0), job(101).gpus(0, workers=3).at(0)],
)


def _resizable_ids(tr) -> set[int]:
    return {j.id for j in tr.jobs if j.resizable}


def test_a_share_picks_that_many_distributed_gpu_jobs_the_same_for_the_same_seed():
    half = with_resizable_share(MIXED, 0.5, seed=7)

    assert _resizable_ids(half) == _resizable_ids(with_resizable_share(MIXED, 0.5, seed=7))
    assert _resizable_ids(half) != _resizable_ids(with_resizable_share(MIXED, 0.5, seed=8))
    assert len(_resizable_ids(half)) == 20
    assert _resizable_ids(half) <= set(range(1, 41))  # never the 1-worker job nor the CPU job
    for j in half.jobs:
        if j.resizable:
            assert (j.min_workers, j.elastic) == (max(1, j.workers // 2), True)
    # A larger share adds jobs to a smaller one's.
    assert _resizable_ids(with_resizable_share(MIXED, 0.25, seed=7)) < _resizable_ids(half)
    assert len(_resizable_ids(with_resizable_share(MIXED, 1.0, seed=7))) == 40


def test_share_zero_is_the_trace_itself_and_replays_as_before():
    assert with_resizable_share(MIXED, 0.0) is MIXED
    with pytest.raises(ValueError, match="between 0 and 1"):
        with_resizable_share(MIXED, 1.5)


# ---- the engine applies resizes (scripted decisions) ------------------------------------------

FOUR = (WorkerPlacement("n1", (0, 1, 2, 3)), WorkerPlacement("n1", (4, 5, 6, 7)),
        WorkerPlacement("n2", (0, 1, 2, 3)), WorkerPlacement("n2", (4, 5, 6, 7)))
N2 = (WorkerPlacement("n2", tuple(range(8))),)
# A low 4x4-GPU job resizable down to 2 runs 10,000 s of work; a high 8-GPU job arrives at 1000 s.
SHRINK_FOR_HIGH = trace(
    [node("n1"), node("n2")],
    [job(1).low().gpus(4, workers=4).resizable(2).lasting(10_000),
     job(2).high(4).gpus(8).at(1000).lasting(2000)],
)


def _scripted(*script: tuple[float, list[Decision]]):
    """A plan that decides the script's next decisions when the clock is at their time, else nothing."""
    left = list(script)

    def plan(snapshot: Snapshot, now: float, usage: Usage | None = None) -> list[Decision]:
        return left.pop(0)[1] if left and left[0][0] == now else []

    return plan


@pytest.mark.parametrize("delay", [0, 60])
def test_a_shrink_then_a_grow_restart_the_job_at_its_new_size(monkeypatch, delay):
    monkeypatch.setattr(engine_module, "plan", _scripted(
        (0, [Admit(1, FOUR, False, "")]),
        (1000, [Shrink(1, 2, FOUR[:2], 2, ""), Reserve(2, N2, "")]),
        (1000 + delay, [Admit(2, N2, False, "")]),
        (3000 + delay, [Grow(1, 4, FOUR, "")]),
    ))
    seen: dict[float, tuple[JobState, int, int] | None] = {}
    sim = Simulator(SHRINK_FOR_HIGH, "seed", suspend_delay=delay)
    sim.before = lambda now: seen.setdefault(now, _as_planned(sim.snapshot()))
    run = sim.run()
    low, high = run.outcomes

    # 1000 s at 4 workers, 2000 s at 2 (1000 s of work), the last 8000 s at 4 again, after 2 restarts.
    assert (low.shrinks, low.grows, low.suspensions) == (1, 1, 0)
    assert low.finished_at == pytest.approx(11_000 + 2 * delay)
    assert high.first_started_at == 1000 + delay
    # Each restart loses its delay on the GPUs the job held: 16 before the shrink, 8 before the grow.
    assert low.lost_gpu_seconds == pytest.approx(delay * (16 + 8))
    assert low.gpu_seconds == pytest.approx(10_000 * 16 + low.lost_gpu_seconds)
    if delay:
        # While it stops, the planner sees it at its new size on its old workers, its new ones held.
        assert seen[1000 + delay] == (JobState.SUSPENDING, 2, 4)
    assert seen[3000 + delay] == (JobState.RUNNING, 2, 2)
    summary = summarize(run)
    assert (summary.shrinks, summary.grows) == (1, 1)
    assert summary.low_jct_p50_s == pytest.approx(11_000 + 2 * delay)


def _as_planned(snapshot: Snapshot) -> tuple[JobState, int, int] | None:
    """Job 1 as the planner sees it (its state, size and how many workers it holds), if unfinished."""
    for low in snapshot.jobs:
        if low.id == 1:
            assert (low.min_workers, low.max_workers) == (2, 4)
            return low.state, low.workers, len(low.placement)
    return None


@pytest.mark.parametrize(
    ("decision", "message"),
    [
        (Shrink(1, 1, FOUR[:1], 2, ""), r"1 workers is outside 2\.\.4"),
        (Shrink(1, 2, FOUR[:3], 2, ""), "3 placements for 2 workers"),
        (Shrink(1, 2, (FOUR[0], WorkerPlacement("n2", (0, 1, 2, 5))), 2, ""), "keep the job's own workers"),
        (Grow(1, 4, FOUR, ""), "runs at 4 workers"),
    ],
)
def test_a_resize_outside_the_jobs_bounds_stops_the_simulation(monkeypatch, decision, message):
    admit = Admit(1, FOUR, False, "")
    monkeypatch.setattr(engine_module, "plan", _scripted((0, [admit]), (1000, [decision])))

    with pytest.raises(SimulationError, match=message):
        simulate(SHRINK_FOR_HIGH, "seed")


def test_a_job_that_is_not_resizable_is_never_resized(monkeypatch):
    fixed = replace(SHRINK_FOR_HIGH, jobs=tuple(replace(j, min_workers=None) for j in SHRINK_FOR_HIGH.jobs))
    monkeypatch.setattr(engine_module, "plan", _scripted(
        (0, [Admit(1, FOUR, False, "")]), (1000, [Shrink(1, 2, FOUR[:2], 2, "")])))

    with pytest.raises(SimulationError, match="not resizable"):
        simulate(fixed, "seed")


# ---- the real planner -------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["seed", "least-lost-work", "newest-first"])
def test_the_planner_shrinks_for_a_high_job_and_grows_back(policy):
    run = simulate(SHRINK_FOR_HIGH, policy, suspend_delay=60)
    low, high = run.outcomes

    assert (low.shrinks, low.grows, low.suspensions) == (1, 1, 0)
    assert high.first_started_at == 1060
    assert low.finished_at == pytest.approx(11_120)


resizable_rows = st.lists(
    st.tuples(
        st.integers(0, 2000),  # submit time
        st.integers(1, 3000),  # duration
        st.sampled_from([(1, 8), (1, 4), (2, 4), (3, 4), (4, 2), (4, 4)]),  # workers, GPUs per worker
        st.sampled_from([0, 0, 4]),  # max_schedule
        st.booleans(),  # resizable (down to half its workers)
    ),
    min_size=1,
    max_size=14,
)


@pytest.mark.parametrize("policy", list(POLICIES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=resizable_rows, delay=st.sampled_from([0, 30]))
def test_resizes_never_overbook_and_conserve_work(policy, rows, delay):
    tr = trace(
        [node("n1"), node("n2"), node("n3", gpus=4)],
        [(job(i).at(t).lasting(d).gpus(g, workers=w).max_schedule(ms)
          .resizable(max(1, w // 2)) if r and w > 1 else
          job(i).at(t).lasting(d).gpus(g, workers=w).max_schedule(ms))
         for i, (t, d, (w, g), ms, r) in enumerate(rows, start=1)],
        Quota(),
    )
    sim = Simulator(tr, policy, suspend_delay=delay)
    sim.before = lambda now: _check_cluster(sim.snapshot())
    sim.observe = lambda now, decisions: _check_sizes(tr, decisions)
    run = sim.run()

    assert summarize(run).jobs_finished == len(rows)
    for o in run.outcomes:
        # Linear scaling: the job's worker-seconds are its duration at all its workers, however resized;
        # allocated GPU time is that plus what suspensions and restarts threw away, plus the
        # suspensions' own delays (held, not counted as lost).
        spent = o.job.duration * o.job.total_gpus + o.lost_gpu_seconds
        suspending = o.suspensions * delay * o.job.total_gpus
        assert spent - 1e-6 <= o.gpu_seconds <= spent + suspending + 1e-6
        if o.job.resizable:
            restarts = o.shrinks + o.grows
            assert o.lost_gpu_seconds <= restarts * delay * o.job.total_gpus + 1e-6
        else:
            assert o.shrinks == o.grows == 0


def _check_cluster(snapshot: Snapshot) -> None:
    """No GPU held by two jobs, no node holding more than it has, no job outside its size bounds."""
    held: set[tuple[str, int]] = set()
    gpus = {n.name: n.gpus for n in snapshot.nodes}
    for j in snapshot.jobs:
        if j.resizable:
            assert j.min_workers <= j.workers <= j.max_workers
        for w in j.placement:
            for g in w.gpus:
                assert 0 <= g < gpus[w.node]
                assert (w.node, g) not in held, f"GPU {g} of {w.node} held twice"
                held.add((w.node, g))
    assert len(held) <= sum(gpus.values())


def _check_sizes(tr, decisions: Sequence[Decision]) -> None:
    by_id = {j.id: j for j in tr.jobs}
    for d in decisions:
        if isinstance(d, Shrink | Grow):
            spec = by_id[d.job_id]
            assert spec.min_workers is not None and spec.min_workers <= d.to <= spec.workers


def test_without_resizable_jobs_the_replay_is_the_one_before():
    # min_workers = workers never resizes: every outcome is as if the column were empty.
    plain = trace([node("n1"), node("n2")],
                  [job(1).low().gpus(4, workers=4).elastic().lasting(10_000),
                   job(2).high(4).gpus(8).at(1000).lasting(2000)])
    pinned = replace(plain, jobs=tuple(replace(j, min_workers=j.workers) if j.id == 1 else j
                                       for j in plain.jobs))

    before, after = simulate(plain, "seed"), simulate(pinned, "seed")

    assert [replace(o, job=None) for o in before.outcomes] == [replace(o, job=None) for o in after.outcomes]
    assert before.outcomes[0].suspensions == 1 and after.outcomes[0].shrinks == 0


# ---- hai sim ----------------------------------------------------------------------------------


def _cli_files(tmp_path) -> list[str]:
    two_nodes = [["n1", "V100", 8, 96, 768], ["n2", "V100", 8, 96, 768]]
    nodes = write_csv(tmp_path / "NODES.csv", NODE_HEADER, two_nodes)
    jobs = write_csv(tmp_path / "JOBS.csv", JOB_HEADER, [
        [1, 0, 10_000, 4, 4, "", 0, "", "", "", ""],
        [2, 1000, 2000, 1, 8, "", 4, "", "", "", ""],
    ])
    return ["--nodes", str(nodes), "--jobs", str(jobs)]


def test_hai_sim_resizable_share_shrinks_instead_of_suspending(tmp_path):
    app = typer.Typer()
    app.command()(sim)
    runner = CliRunner()

    plain = runner.invoke(app, [*_cli_files(tmp_path), "--json"])
    resized = runner.invoke(app, [*_cli_files(tmp_path), "--json", "--resizable-share", "1"])
    bad = runner.invoke(app, [*_cli_files(tmp_path), "--resizable-share", "1.5"])

    assert plain.exit_code == 0 and resized.exit_code == 0, resized.output
    before, after = json.loads(plain.stdout), json.loads(resized.stdout)
    assert (before["suspensions"], before["shrinks"], before["grows"]) == (1, 0, 0)
    assert (after["suspensions"], after["shrinks"], after["grows"]) == (0, 1, 1)
    assert bad.exit_code == 2
