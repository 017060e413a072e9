"""The one retry helper: transient errors are retried with jittered, growing delays; others raise at once."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from hai_airflow.client import HaiError, HaiUnreachable
from hai_airflow.hooks.retry import Backoff, aretry_transient, is_transient, retry_transient

log = logging.getLogger("test")


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        pytest.param(HaiUnreachable("http://x"), True, id="no server answered"),
        pytest.param(HaiError(503, "restarting"), True, id="server error"),
        pytest.param(HaiError(429, "slow down"), True, id="too many requests"),
        pytest.param(HaiError(404, "no such job"), False, id="not found is final"),
        pytest.param(HaiError(403, "not yours"), False, id="forbidden is final"),
    ],
)
def test_transient_errors(error: HaiError, transient: bool) -> None:
    assert is_transient(error) is transient


def test_backoff_grows_to_its_maximum_with_jitter_and_resets() -> None:
    backoff = Backoff(maximum=8, rng=random.Random(1))
    delays = [backoff.next_delay() for _ in range(6)]
    for delay, ceiling in zip(delays, [1, 2, 4, 8, 8, 8], strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert len(set(delays)) == len(delays), "jittered delays differ"
    backoff.reset()
    assert backoff.next_delay() <= 1


def test_two_backoffs_do_not_wait_in_lockstep() -> None:
    a, b = Backoff(rng=random.Random(1)), Backoff(rng=random.Random(2))
    assert [a.next_delay() for _ in range(4)] != [b.next_delay() for _ in range(4)]


def test_retries_transient_errors_until_the_call_answers() -> None:
    answers: list[object] = [HaiUnreachable("http://x"), HaiError(502, "bad gateway"), "ok"]
    slept: list[float] = []

    def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    assert retry_transient(call, what="testing", log=log, sleep=slept.append) == "ok"
    assert len(slept) == 2


def test_a_final_error_is_raised_at_once_and_attempts_are_bounded() -> None:
    slept: list[float] = []

    def refused() -> None:
        raise HaiError(400, "bad spec")

    with pytest.raises(HaiError, match="bad spec"):
        retry_transient(refused, what="testing", log=log, sleep=slept.append)
    assert slept == []

    def away() -> None:
        raise HaiUnreachable("http://x")

    with pytest.raises(HaiUnreachable):
        retry_transient(away, what="testing", log=log, attempts=3, sleep=slept.append)
    assert len(slept) == 2


def test_async_twin_retries_the_same_way() -> None:
    answers: list[object] = [HaiError(503, "restarting"), 7]
    slept: list[float] = []

    async def call() -> int:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return int(str(answer))

    async def sleep(delay: float) -> None:
        slept.append(delay)

    assert asyncio.run(aretry_transient(call, what="testing", log=log, sleep=sleep)) == 7
    assert len(slept) == 1
