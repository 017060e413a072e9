"""The one duration grammar of flags, forms and reasons: what it takes, refuses, and writes back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hai_airflow import durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("4h", 14400),
        ("1h30m", 5400),
        ("90m", 5400),
        ("2d", 172800),
        ("45s", 45),
        ("1d2h3m4s", 93784),
        ("4H", 14400),
        (" 1h 30m ", 5400),
        ("1:30:00", 5400),
        ("0:00:05", 5),
        ("2-12:00:00", 216000),
    ],
)
def test_parse_takes_units_and_clock_forms(text: str, seconds: int) -> None:
    assert durations.parse(text) == seconds


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("90", "'90' has no unit: write 90m for minutes or 90s for seconds"),
        ("", "is not a duration"),
        ("4x", "is not a duration: write a number with units"),
        ("1:60:00", "is not a duration"),
        ("30m4h", "is not a duration"),
        ("-1h", "is not a duration"),
    ],
)
def test_parse_refuses_with_the_forms_it_takes(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        durations.parse(text)


@pytest.mark.parametrize(
    ("seconds", "text"), [(14400, "4h"), (5400, "1h30m"), (45, "45s"), (0, "0s"), (93784, "1d2h3m4s")]
)
def test_text_writes_the_largest_exact_units(seconds: int, text: str) -> None:
    assert durations.text(seconds) == text


@given(st.integers(min_value=1, max_value=10**8))
def test_text_reads_back_as_the_same_seconds(seconds: int) -> None:
    assert durations.parse(durations.text(seconds)) == seconds
