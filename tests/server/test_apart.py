"""Work computed apart, in a forked child: its answer comes back; its failure is the parent's error."""

from __future__ import annotations

import os

import pytest

from hai_airflow.server.control.forked import ChildFailed, run_apart


def test_the_answer_comes_from_another_process_that_saw_this_one_s_memory() -> None:
    table = {i: i * i for i in range(10_000)}
    pid, total = run_apart(lambda: (os.getpid(), sum(table.values())))
    assert pid != os.getpid()
    assert total == sum(i * i for i in range(10_000))


def test_an_exception_in_the_child_is_the_parent_s_error_with_its_words() -> None:
    def fails() -> int:
        raise ValueError("no such job 7")

    with pytest.raises(ChildFailed, match="ValueError: no such job 7"):
        run_apart(fails)


def test_a_child_that_dies_is_an_error_not_a_hang() -> None:
    with pytest.raises(ChildFailed, match="status"):
        run_apart(lambda: os._exit(3))

