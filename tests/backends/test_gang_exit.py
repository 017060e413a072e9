"""The one gang exit rule every backend reports an instance's end by: which worker decides, and its words."""

from __future__ import annotations

from typing import Any

import pytest

from hai_airflow.backends.common.base import Exit
from hai_airflow.backends.common.launches import WorkerEnd, exit_words, gang_exit

VANISHED = "its process (pid 9) vanished without an exit code"


def proc(code: int | None, node: str = "node-0") -> WorkerEnd:
    """A local worker: a process whose negative exit code is a signal."""
    return WorkerEnd.of_process(code, node, VANISHED)


def box(code: int | None, oom: bool = False) -> WorkerEnd:
    """A container or pod: 128 + N is signal N."""
    return WorkerEnd.of_container(code, oom, "its container disappeared")


def case(
    id: str, workers: list[WorkerEnd], expected: Exit, first_failed: int | None = None, stop: bool = False
) -> Any:
    """One row: the workers' ends (and who was seen failing first, whether a stop was asked) -> the Exit."""
    return pytest.param(workers, first_failed, stop, expected, id=id)


def ended(code: int | None, words: str, lost: bool = False) -> Exit:
    return Exit(7, code, words, lost=lost)


@pytest.mark.parametrize(
    ("workers", "first_failed", "stop_asked", "expected"),
    [
        case("a clean exit completes", [box(0)], ended(0, "completed")),
        case("a lone worker's code is the instance's", [box(3)], ended(3, "exit code 3")),
        case("a process killed on a stop", [proc(-9)], ended(-9, "killed by signal 9"), stop=True),
        case(
            "a container's 128+N names the signal and the code",
            [box(137)], ended(137, "killed by signal 9 (exit code 137)"), stop=True,
        ),
        case(
            "a process's 137 is only an exit code: the shell may have chosen it",
            [proc(137)], ended(137, "exit code 137"),
        ),
        case(
            "an out-of-memory kill says so",
            [box(137, oom=True)], ended(137, "killed for exceeding its memory limit (exit code 137)"),
        ),
        case("a gang of clean exits completes", [box(0), box(0), box(0)], ended(0, "completed")),
        case(
            "the worker seen failing first decides over a lower rank killed after it",
            [box(137), box(9)], ended(9, "worker 1 failed: exit code 9"), first_failed=1,
        ),
        case(
            "a local gang's reason names the failed worker's node",
            [proc(2, "node-0"), proc(-9, "node-1")], ended(2, "worker 0 on node-0 failed: exit code 2"),
            first_failed=0,
        ),
        case(
            "failures seen together: the lowest failing rank decides",
            [box(0), box(4), box(5)], ended(4, "worker 1 failed: exit code 4"),
        ),
        case("a failure decides over a save", [box(75), box(3)], ended(3, "worker 1 failed: exit code 3")),
        case(
            "an unasked save decides over clean exits, so the job is resumed",
            [box(0), box(75)], ended(75, "worker 1 failed: exit code 75"),
        ),
        case(
            "a gang that saved on a stop exits 75 without naming a worker",
            [proc(75), proc(75)], ended(75, "exit code 75"), stop=True,
        ),
        case(
            "a gang killed by a stop names no worker",
            [proc(-9), proc(-9), proc(-9)], ended(-9, "killed by signal 9"), stop=True,
        ),
        case(
            "after a stop, a worker's code decides over one that has none",
            [box(75), box(None)], ended(75, "exit code 75"), stop=True,
        ),
        case(
            "a failure that came before the stop still names its worker",
            [box(137), box(3)], ended(3, "worker 1 failed: exit code 3"), first_failed=1, stop=True,
        ),
        case("a worker that vanished is lost", [proc(None)], ended(None, VANISHED, lost=True)),
        case(
            "a gang worker that vanished unasked loses the instance",
            [proc(None, "node-0"), proc(0, "node-1")],
            ended(None, f"worker 0 on node-0 failed: {VANISHED}", lost=True),
        ),
        case(
            "a stopped instance without exit codes is not lost",
            [box(None), box(None)],
            ended(None, "stopped by the platform (its container disappeared)"),
            stop=True,
        ),
    ],
)  # fmt: skip
def test_gang_exit(
    workers: list[WorkerEnd], first_failed: int | None, stop_asked: bool, expected: Exit
) -> None:
    assert gang_exit(7, workers, first_failed, stop_asked) == expected


def test_the_rule_reads_its_input_only() -> None:
    workers = (box(0), box(75), box(3))
    gang_exit(1, workers)
    assert workers == (box(0), box(75), box(3))


@pytest.mark.parametrize(
    ("end", "words"),
    [
        pytest.param(WorkerEnd.of_process(-15), "killed by signal 15", id="process signal"),
        pytest.param(
            WorkerEnd.of_container(143), "killed by signal 15 (exit code 143)", id="container signal"
        ),
        pytest.param(WorkerEnd.of_container(128), "exit code 128", id="128 is no signal"),
        pytest.param(WorkerEnd.of_container(None), "no exit code", id="no code by default"),
        pytest.param(WorkerEnd(None, missing="Evicted: low"), "Evicted: low", id="what is known instead"),
    ],
)
def test_exit_words(end: WorkerEnd, words: str) -> None:
    assert exit_words(end) == words
