"""The intake: items queued while a batch is handled become the next batch, each item gets its own
outcome, a second thread handles a batch while the first still waits, and the threads run only
while there is work."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from hai_airflow.server.intake import group_commit
from hai_airflow.server.intake.group_commit import Intake


class Recorder:
    """A handler that records its batches; the first call waits until `release` is set."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = threading.Event()
        self.entered = threading.Event()

    def __call__(self, items: list[int]) -> list[int | BaseException]:
        self.entered.set()
        self.release.wait(10)
        self.batches.append(items)
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]


async def _gather(box: Intake[int, int], items: range) -> list[object]:
    return await asyncio.gather(*(box.put(i) for i in items), return_exceptions=True)


async def _behind_a_busy_batch(box: Intake[int, int], handler: Recorder, rest: range) -> list[object]:
    """Put 0, and `rest` while the handler is still busy with the batch of 0 alone; all outcomes."""
    first = asyncio.ensure_future(box.put(0))
    while not handler.entered.is_set():
        await asyncio.sleep(0.001)
    others = asyncio.ensure_future(_gather(box, rest))
    await asyncio.sleep(0.05)  # they queue up behind it
    handler.release.set()
    return [await first, *await others]


def test_items_queued_during_a_batch_share_the_next_one_and_each_gets_its_outcome() -> None:
    handler = Recorder()
    box: Intake[int, int] = Intake(handler, "test-intake")
    outcomes = asyncio.run(_behind_a_busy_batch(box, handler, range(1, 9)))
    box.stop()
    assert handler.batches == [[0], list(range(1, 9))]
    assert [o if isinstance(o, int) else str(o) for o in outcomes] == [
        0, "odd 1", 20, "odd 3", 40, "odd 5", 60, "odd 7", 80,
    ]  # fmt: skip


def test_a_batch_is_never_larger_than_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(group_commit, "BATCH_LIMIT", 3)
    handler = Recorder()
    box: Intake[int, int] = Intake(handler, "test-intake")
    assert asyncio.run(_behind_a_busy_batch(box, handler, range(2, 16, 2))) == list(range(0, 160, 20))
    box.stop()
    assert [len(b) for b in handler.batches] == [1, 3, 3, 1]


def test_a_handler_that_raises_fails_every_item_of_its_batch_and_the_intake_goes_on() -> None:
    calls: list[list[int]] = []

    def handle(items: list[int]) -> list[int | BaseException]:
        calls.append(items)
        if items == [1]:
            raise RuntimeError("database gone")
        return items

    box: Intake[int, int] = Intake(handle, "test-intake")

    async def scenario() -> tuple[object, int]:
        failed = await asyncio.gather(box.put(1), return_exceptions=True)
        return failed[0], await box.put(2)

    failed, ok = asyncio.run(scenario())
    box.stop()
    assert isinstance(failed, RuntimeError) and str(failed) == "database gone"
    assert ok == 2 and calls == [[1], [2]]


def test_the_thread_ends_when_idle_and_a_later_put_starts_another(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(group_commit, "IDLE_SECONDS", 0.05)
    box: Intake[int, int] = Intake(lambda items: list(items), "test-intake-idle")
    alive = lambda: any(t.name == "test-intake-idle" for t in threading.enumerate())  # noqa: E731
    assert asyncio.run(box.put(7)) == 7
    assert alive()
    deadline = time.monotonic() + 5
    while alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not alive()
    assert asyncio.run(box.put(8)) == 8
    box.stop()
    assert not alive()


def test_stop_answers_what_is_queued_before_the_thread_ends() -> None:
    handler = Recorder()
    box: Intake[int, int] = Intake(handler, "test-intake")
    answers: list[object] = []

    def requests() -> None:
        answers.extend(asyncio.run(_gather(box, range(0, 8, 2))))

    caller = threading.Thread(target=requests)
    caller.start()
    assert handler.entered.wait(5)
    time.sleep(0.05)
    stopper = threading.Thread(target=box.stop)
    stopper.start()
    handler.release.set()
    stopper.join(5)
    caller.join(5)
    assert not stopper.is_alive() and not caller.is_alive()
    assert answers == [0, 20, 40, 60]
    assert sum(len(b) for b in handler.batches) == 4


def test_with_two_threads_a_batch_is_answered_while_another_still_waits() -> None:
    entered, release = threading.Event(), threading.Event()

    def handle(items: list[int]) -> list[int | BaseException]:
        if 0 in items:  # the first batch waits (as for the database) until released
            entered.set()
            release.wait(10)
        return [i * 10 for i in items]

    box: Intake[int, int] = Intake(handle, "test-intake-two", workers=2)
    alive = lambda: [t for t in threading.enumerate() if t.name == "test-intake-two"]  # noqa: E731

    async def scenario() -> tuple[int, bool, int]:
        first = asyncio.ensure_future(box.put(0))
        while not entered.is_set():
            await asyncio.sleep(0.001)
        later = await asyncio.wait_for(box.put(1), 5)
        first_done = first.done()
        release.set()
        return later, first_done, await first

    assert asyncio.run(scenario()) == (10, False, 0)
    assert len(alive()) == 2
    box.stop()
    assert alive() == []
