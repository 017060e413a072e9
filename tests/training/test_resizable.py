"""The resize rule: progress in samples, Horovod's scaling, and sharding that never skips or repeats."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hai_airflow.training import LinearScaling, Progress, SampleStream, resumed_progress

RULE = LinearScaling(total_samples=1000, batch_per_rank=8, base_lr=0.005)


def run_segments(rule: LinearScaling, segments: list[tuple[int, int]]) -> tuple[Progress, list[int]]:
    """Run ``(size, steps)`` segments in order, the last one to the end; every position each rank took."""
    progress, taken = Progress(), list[int]()
    for n, (size, steps) in enumerate(segments):
        last = n == len(segments) - 1
        todo = (
            rule.steps_left(progress.samples, size)
            if last
            else min(steps, rule.steps_left(progress.samples, size))
        )
        for _ in range(todo):
            for rank in range(size):
                taken.extend(rule.shard(progress.samples, size, rank))
            progress = rule.after_step(progress, size)
    return progress, taken


def test_a_step_takes_a_batch_per_rank_and_the_learning_rate_scales_with_size() -> None:
    assert [RULE.global_batch(s) for s in (1, 2, 4)] == [8, 16, 32]
    assert [RULE.lr(s) for s in (1, 2, 4)] == pytest.approx([0.005, 0.01, 0.02])
    # 1000 = 31 x 32 + 8: the last step at size 4 is short, 2 samples per rank.
    assert RULE.steps_left(0, 4) == 32
    assert [len(RULE.shard(992, 4, r)) for r in range(4)] == [2, 2, 2, 2]
    assert RULE.step_samples(992, 4) == 8 and RULE.steps_left(1000, 4) == 0


def test_ranks_take_every_size_th_position_of_the_global_batch() -> None:
    assert [list(RULE.shard(64, 4, r)) for r in range(4)] == [list(range(64 + r, 96, 4)) for r in range(4)]
    # A short last step may leave a rank nothing.
    short = LinearScaling(total_samples=34, batch_per_rank=8, base_lr=1.0)
    assert [list(short.shard(32, 4, r)) for r in range(4)] == [[32], [33], [], []]


def test_resized_at_size_4_then_2_then_4_the_samples_and_steps_are_exact() -> None:
    progress, taken = run_segments(RULE, [(4, 10), (2, 7), (4, 0)])
    # 10 steps of 32, 7 of 16, then the remaining 568 at 32 a step: 17 full and one of 24.
    assert (progress.samples, progress.step, progress.size) == (1000, 10 + 7 + 18, 4)
    assert sorted(taken) == list(range(1000))


@given(
    total=st.integers(1, 400),
    batch=st.integers(1, 9),
    segments=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 12)), min_size=1, max_size=5),
)
def test_any_resizes_train_on_each_position_once_in_the_steps_the_rule_says(
    total: int, batch: int, segments: list[tuple[int, int]]
) -> None:
    rule = LinearScaling(total_samples=total, batch_per_rank=batch, base_lr=0.1)
    progress, taken = run_segments(rule, segments)
    assert progress.samples == total
    assert sorted(taken) == list(range(total)), "a position skipped or trained on twice"
    # The step count: each segment's samples in global batches of its size, rounded up.
    expected, done = 0, 0
    for n, (size, steps) in enumerate(segments):
        steps = (
            rule.steps_left(done, size) if n == len(segments) - 1 else min(steps, rule.steps_left(done, size))
        )
        expected += steps
        done = min(total, done + steps * rule.global_batch(size))
    assert progress.step == expected


def test_the_stream_is_each_epoch_a_shuffle_of_the_data_set() -> None:
    stream = SampleStream(samples=10, seed=3)
    first, second = stream.indices(range(0, 10)), stream.indices(range(10, 20))
    assert sorted(first) == sorted(second) == list(range(10)) and first != second
    assert SampleStream(10, seed=3).indices(range(5, 15)) == first[5:] + second[:5]
    assert SampleStream(10, seed=4).indices(range(10)) != first
    seen = Counter(stream.indices(range(10, 40)))
    assert set(seen.values()) == {3}, "three epochs' worth sees every sample three times"


def test_progress_round_trips_through_a_checkpoint_and_rejects_junk() -> None:
    progress = Progress(step=12, samples=384, size=4)
    assert Progress.from_state(progress.as_state()) == progress
    assert resumed_progress({"progress": progress.as_state()}, 12, RULE, size=2) == progress
    with pytest.raises(ValueError, match=r"progress.samples=-1"):
        Progress.from_state({"step": 1, "samples": -1, "size": 2})
    with pytest.raises(ValueError, match=r"progress.size=0"):
        Progress.from_state({"step": 1, "samples": 0, "size": 0})
    with pytest.raises(ValueError, match="expected a dict"):
        Progress.from_state([1, 2, 3])


def test_a_checkpoint_without_progress_counts_full_batches_at_the_current_size() -> None:
    assert resumed_progress({"model": {}}, 10, RULE, size=2) == Progress(step=10, samples=160, size=2)
    assert resumed_progress({}, 100, RULE, size=4).samples == 1000


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"total_samples": 0}, "total_samples=0"),
        ({"batch_per_rank": 0}, "batch_per_rank=0"),
        ({"base_lr": 0.0}, "base_lr=0.0"),
    ],
)
def test_a_bad_rule_is_named(fields: dict[str, float], message: str) -> None:
    values = {"total_samples": 10, "batch_per_rank": 2, "base_lr": 0.1} | fields
    with pytest.raises(ValueError, match=message):
        LinearScaling(**values)  # type: ignore[arg-type]


def test_a_finished_run_has_no_next_step_and_a_bad_rank_is_named() -> None:
    with pytest.raises(ValueError, match="the run is complete"):
        RULE.after_step(Progress(step=32, samples=1000, size=4), 4)
    with pytest.raises(ValueError, match=r"rank=4: expected 0\.\.3"):
        RULE.shard(0, 4, 4)
    with pytest.raises(ValueError, match="size=0"):
        RULE.lr(0)
