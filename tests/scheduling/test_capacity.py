"""Trials on free capacity: undone unless committed, exactly, and nested; what a job asks for."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hai_airflow.scheduling.capacity import FreeCapacity
from hai_airflow.scheduling.layout import Layout
from hai_airflow.scheduling.model import Job, Node, Shape, WorkerPlacement
from hai_airflow.scheduling.placement import place
from hai_airflow.scheduling.usage import Usage


def capacity() -> FreeCapacity:
    layout = Layout.build((Node("n1", "V100", 8, 0.3, 64), Node("n2", "V100", 4, 16, 32)))
    return FreeCapacity.build(Usage.fresh(layout, []))


def state(cap: FreeCapacity) -> tuple[object, ...]:
    """Every node's free resources and the bucket index, copied."""
    nodes = tuple((tuple(f.gpus), f.cpus, f.memory_gb, f.blocked) for f in map(cap.node, range(2)))
    return nodes, {t: [tuple(b) for b in lists] for t, lists in cap.buckets.items()}


def test_a_trial_left_without_commit_puts_every_node_back_exactly():
    cap = capacity()
    n1, n2 = cap.named_node("n1"), cap.named_node("n2")
    cap.take(n2, [0], 1, 1)
    before = state(cap)

    with cap.trial():
        cap.take(n1, [0, 3], 0.1, 8)
        cap.give(n2, [0], 1, 1)
        cap.block(n2)
        cap.restrict(n1, [7], 0.2, 1)

    assert state(cap) == before
    assert n1.cpus == 0.3 and n1.gpus == list(range(8))
    assert cap.open_trial is None


def test_a_committed_trial_keeps_its_changes():
    cap = capacity()
    n1 = cap.named_node("n1")

    with cap.trial() as trial:
        cap.take(n1, [1], 0.1, 8)
        trial.commit()

    assert n1.gpus == [0, 2, 3, 4, 5, 6, 7]
    assert list(cap.candidates("V100", 0)) == [cap.named_node("n2"), n1]


def test_an_outer_trial_undoes_what_an_inner_one_committed():
    cap = capacity()
    before = state(cap)

    with cap.trial():
        with cap.trial() as inner:
            assert place(cap, Shape("V100", 2, 4, 0.1, 8)) is not None
            inner.commit()
        assert state(cap) != before

    assert state(cap) == before


def test_commit_without_gains_keeps_the_takes_but_not_the_gives():
    cap = capacity()
    n1, n2 = cap.named_node("n1"), cap.named_node("n2")
    cap.take(n1, [0, 1, 2, 3], 0.2, 32)

    with cap.trial() as trial:
        cap.give(n1, [0, 1, 2, 3], 0.2, 32)
        cap.take(n1, [0, 1], 0.1, 8)
        cap.take(n2, [0], 1, 2)
        trial.commit_without_gains()

    assert (n1.gpus, n1.memory_gb) == ([4, 5, 6, 7], 32)
    assert (n2.gpus, n2.cpus, n2.memory_gb) == ([1, 2, 3], 15, 30)


def test_grown_moves_only_when_free_capacity_grows_for_good():
    cap = capacity()
    n1, n2 = cap.named_node("n1"), cap.named_node("n2")
    cap.take(n1, [0, 1], 0.1, 8)
    cap.block(n2)
    assert cap.grown == 0, "takes and blocks only shrink free capacity"
    with cap.trial():
        cap.give(n1, [0], 0, 0)
    with cap.trial() as trial:
        cap.give(n1, [0, 1], 0.1, 8)
        cap.take(n1, [0], 0, 0)
        trial.commit_without_gains()
    assert cap.grown == 0, "a trial undone, or committed without its gains, leaves nothing grown"
    with cap.trial() as outer:
        with cap.trial() as inner:
            cap.give(n1, [1], 0, 0)
            inner.commit()
        assert cap.grown == 0, "an outer trial may still undo what an inner one gave"
        outer.commit()
    assert cap.grown == 1
    cap.give(n1, [0], 0.1, 8)
    assert cap.grown == 2


def test_a_trial_closes_once_and_innermost_first():
    cap = capacity()
    outer = cap.trial()
    inner = cap.trial()

    with pytest.raises(RuntimeError, match="still open"):
        outer.commit()
    inner.undo()
    with pytest.raises(RuntimeError, match="already"):
        inner.commit()
    outer.undo()
    assert cap.open_trial is None


def test_an_undone_trial_puts_the_version_back_and_no_version_names_two_capacities():
    cap = capacity()
    n1 = cap.named_node("n1")
    before = cap.version

    with cap.trial():
        cap.take(n1, [0], 0.1, 8)
        inside = cap.version
        assert inside != before

    assert cap.version == before, "the capacity is as it was, so a figure derived before still holds"
    cap.take(n1, [1], 0.1, 8)
    assert cap.version not in (before, inside)


def test_fits_asks_for_every_worker_and_every_resource_in_one_pool():
    cap = capacity()  # n1: 8 GPUs, 0.3 CPUs, 64 GB; n2: 4 GPUs, 16 CPUs, 32 GB

    assert cap.fits(Shape("V100", 2, 4, 0.1, 8))
    assert not cap.fits(Shape("V100", 2, 4, 1, 8)), "n1 lacks the CPUs for the second worker"
    assert cap.fits(Shape("V100", 1, 8, 0.3, 64)), "0.1 + 0.2 CPUs would fit too: float slack"
    assert not cap.fits(Shape("A100", 1, 1, 0, 0)), "no node of the type"
    assert cap.fits(Shape(None, 1, 0, 2, 16)), "a CPU worker goes on any node"


def test_occupy_undoes_release_and_the_trial_undoes_both():
    cap = capacity()
    n2 = cap.named_node("n2")
    victim = Job(id=9, user="u", group="g", state="RUNNING", max_schedule=0, submitted_at=0.0,
                 gpus_per_worker=2, cpus_per_worker=4, memory_gb_per_worker=8, gpu_type="V100",
                 placement=(WorkerPlacement("n2", (0, 1), 4, 8),))
    cap.take(n2, [0, 1], 4, 8)
    before = state(cap)

    with cap.trial():
        cap.release(victim)
        assert (n2.gpus, n2.cpus, n2.memory_gb) == ([0, 1, 2, 3], 16, 32)
        cap.occupy(victim)
        assert state(cap) == before

    assert state(cap) == before


def test_a_blocked_node_opened_in_a_trial_says_what_it_would_hold():
    cap = capacity()
    n2 = cap.named_node("n2")
    shape = Shape("V100", 1, 4, 1, 8)  # n1 lacks the CPUs, n2 has room
    cap.block(n2)
    assert not cap.fits(shape)

    with cap.trial():
        cap.unblock(n2)
        assert cap.fits(shape)

    assert n2.blocked and not cap.fits(shape)


def test_a_job_s_shape_follows_its_fields_through_replace():
    job = Job(id=1, user="u", group="g", state="PENDING", max_schedule=0, submitted_at=0.0,
              workers=0, gpus_per_worker=2, cpus_per_worker=8.0, memory_gb_per_worker=64.0, gpu_type="V100")
    assert job.shape == Shape("V100", 1, 2, 8.0, 64.0)  # no workers still asks for one
    bigger = replace(job, workers=4, gpu_type=None)
    assert bigger.shape == Shape(None, 4, 2, 8.0, 64.0)
    assert bigger != job and replace(bigger, workers=0, gpu_type="V100") == job
