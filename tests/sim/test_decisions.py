"""Every decision of the simulator on the small generated traces, under every policy, is as recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hai_airflow.scheduling import POLICIES

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"


@pytest.fixture
def decisions(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import decisions

    return decisions


def test_every_decision_on_the_small_traces_is_as_recorded(decisions):
    recorded = json.loads(decisions.RECORDED.read_text())

    found = decisions.hashes(decisions.SMALL, sorted(POLICIES))

    assert sorted(found) == sorted(case.name for case in decisions.SMALL)
    moved = decisions.differences(found, recorded)
    assert not moved, f"decisions moved in: {', '.join(moved)} (if meant, record them with --write)"
