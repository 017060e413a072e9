"""The array grammar, pure: Slurm's `--array` forms, the limit, and what is refused."""

from __future__ import annotations

import re

import pytest

from hai_airflow.arrays import MAX_ELEMENTS, Array, describe, parse


@pytest.mark.parametrize(
    ("text", "indices", "limit"),
    [
        ("0-9", tuple(range(10)), None),
        ("0-9%2", tuple(range(10)), 2),
        ("0-15:4", (0, 4, 8, 12), None),
        ("1,3,5", (1, 3, 5), None),
        ("0-3,8,2", (0, 1, 2, 3, 8), None),
        ("7%1", (7,), 1),
    ],
)
def test_the_forms_slurm_users_write(text: str, indices: tuple[int, ...], limit: int | None) -> None:
    assert parse(text) == Array(indices, limit)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0-9%0", "%0 would run none"),
        ("0-9%x", "the limit after % must be a number"),
        ("a-b", "'a-b' is not an index or a range"),
        ("5-1", "'5-1' is not a range from low to high"),
        ("0-8:0", "is not a range from low to high"),
        (f"0-{MAX_ELEMENTS}", f"makes more than {MAX_ELEMENTS} tasks"),
        ("0-999999999", "at most 1,000,000"),
    ],
)
def test_what_is_refused_and_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse(text)


def test_described_as_people_read_it() -> None:
    assert describe(parse("0-9%2")) == "10 tasks (indices 0-9), at most 2 at once"
    assert describe(parse("3")) == "1 task (indices 3)"
    assert describe(parse("0-40:4")) == "11 tasks (indices 0,4,8,12,16,20,24,28,…)"
