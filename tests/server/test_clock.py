"""The server's clock: follows the monotonic clock, slews towards the wall clock, never goes back."""

from __future__ import annotations

import pytest

from hai_airflow.server.store.clock import SLEW, Clock


class Fake:
    def __init__(self) -> None:
        self.wall, self.mono = 1_000_000.0, 50.0

    def step(self, seconds: float) -> None:
        self.wall += seconds

    def run(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@pytest.fixture
def fake() -> Fake:
    return Fake()


@pytest.fixture
def clock(fake: Fake) -> Clock:
    return Clock(lambda: fake.wall, lambda: fake.mono)


def test_it_follows_the_wall_clock_while_the_wall_clock_does_not_step(fake: Fake, clock: Clock) -> None:
    assert clock.now() == pytest.approx(1_000_000.0)
    fake.run(12.5)
    assert clock.now() == pytest.approx(1_000_012.5)


@pytest.mark.parametrize("step", [300.0, -300.0])
def test_a_step_of_the_wall_clock_is_taken_up_slowly_and_never_backwards(
    fake: Fake, clock: Clock, step: float
) -> None:
    before = clock.now()
    fake.step(step)
    assert clock.now() == pytest.approx(before)  # no time passed: nothing changes
    fake.run(10.0)
    # ten seconds passed, plus at most SLEW of them towards the wall clock
    assert clock.now() == pytest.approx(before + 10.0 + SLEW * 10.0 * (1 if step > 0 else -1))
    last = clock.now()
    for _ in range(100):
        fake.run(1.0)
        now = clock.now()
        assert now > last
        last = now
    fake.run(abs(step) / SLEW)
    assert clock.now() == pytest.approx(fake.wall)  # caught up, and stays there
    fake.run(1.0)
    assert clock.now() == pytest.approx(fake.wall)


def test_not_before_moves_it_forward_only(fake: Fake, clock: Clock) -> None:
    start = clock.now()
    clock.not_before(start - 100)
    assert clock.now() == pytest.approx(start)
    clock.not_before(start + 100)
    assert clock.now() == pytest.approx(start + 100)
    assert clock.gap() == pytest.approx(-100)
    fake.run(1.0)
    assert clock.now() == pytest.approx(start + 100 + 1 - SLEW)


def test_a_step_is_reported_once_until_it_is_taken_up(fake: Fake, clock: Clock) -> None:
    assert clock.step_seen() is None
    fake.step(-300.0)
    assert clock.step_seen() == pytest.approx(-300.0)
    assert clock.step_seen() is None
    fake.run(300.0 / SLEW)
    assert clock.step_seen() is None
    fake.step(60.0)
    assert clock.step_seen() == pytest.approx(60.0)
