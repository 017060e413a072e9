"""The suite's own time report (tests/support/durations.py): what the tables of docs/testing.md add up."""

from __future__ import annotations

from tests.support.durations import Timing, tables, tier_of


def test_a_tests_tier_is_its_first_outer_marker_or_fast() -> None:
    assert tier_of({"test_x": 1, "kube": 1, "docker": 1}) == "kube"
    assert tier_of({"test_x": 1, "slow": 1}) == "slow"
    assert tier_of({"test_x": 1, "postgres": 1}) == "fast"


def test_the_tables_sum_each_tier_module_and_worker() -> None:
    tests = {
        "tests/a.py::one": Timing("tests/a.py", "fast", "gw0", 3.0),
        "tests/a.py::two": Timing("tests/a.py", "fast", "gw1", 1.0),
        "tests/b.py::three": Timing("tests/b.py", "kube", "gw1", 6.0),
    }
    text = tables(tests, wall=7.0)
    assert text.startswith("3 tests, 10 s of test time in 7 s of wall time on 2 worker(s).")
    assert "| kube | 1 | 6 | 60.0% | 6.0 |" in text
    assert "| fast | 2 | 4 | 40.0% | 3.0 |" in text
    assert "| tests/b.py | 1 | 6 | 60.0% | 6.0 |" in text
    assert "| gw1 | 2 | 7 | 70.0% | 6.0 |" in text
    # the costliest first
    assert text.index("| tests/b.py |") < text.index("| tests/a.py |")
