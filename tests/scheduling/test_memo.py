"""The cycle's memo: kept while free capacity only shrinks, forgotten once it grows."""

from __future__ import annotations

from hai_airflow.scheduling import POLICIES
from hai_airflow.scheduling.cycle import Cycle
from hai_airflow.scheduling.memo import Hopeless
from hai_airflow.scheduling.model import Shape

from .builders import T0, job, node, snapshot

EIGHT = Shape("V100", 1, 8, 0, 0)


def test_the_memo_is_kept_while_capacity_shrinks_and_forgotten_once_it_grows():
    snap = snapshot([node("n1")], [job(1).high().gpus(8)])
    cycle = Cycle.start(snap, POLICIES["seed"], T0, list(snap.jobs), None)
    memo = cycle.memo()
    memo.no_victims.add(EIGHT, ("V100",))
    n1 = cycle.cap.named_node("n1")

    cycle.cap.take(n1, [0], 0, 0)
    with cycle.cap.trial():
        cycle.cap.give(n1, [0], 0, 0)
    assert cycle.memo() is memo, "a take, and a give undone with its trial, leave nothing grown"

    cycle.cap.give(n1, [0], 0, 0)
    assert cycle.memo() is not memo
    assert not cycle.memo().no_victims.holds(EIGHT, ("V100",))


def test_a_shape_asking_for_more_in_no_more_pools_fails_with_the_one_that_failed():
    failed = Hopeless()
    failed.add(Shape(None, 2, 4, 8, 64), ("A100", "V100"))

    assert failed.holds(Shape("V100", 2, 8, 8, 64), ("V100",))
    assert failed.holds(Shape(None, 3, 4, 16, 64), ("A100", "V100"))
    assert not failed.holds(Shape(None, 1, 4, 8, 64), ("A100", "V100")), "fewer workers may fit"
    assert not failed.holds(Shape(None, 2, 8, 8, 64), ("A100", "T4", "V100")), "a pool not tried"
