"""How fast another user's requests must answer while one user floods the server (issue 56): the
median within NEIGHBOUR_SECONDS, and every one within SLOWEST_SECONDS. On the 2-core CI machine the
parallel suite's other workers alone can hold a single answer past a second; a flood that reaches
the neighbour (the code these tests guard against) holds every answer for 5 s to minutes."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

NEIGHBOUR_SECONDS = 1.0
SLOWEST_SECONDS = 3.0


def assert_answered_fast(latencies: Sequence[float], who: str) -> None:
    assert latencies, f"{who} never asked during the flood"
    median, slowest = statistics.median(latencies), max(latencies)
    assert median < NEIGHBOUR_SECONDS and slowest < SLOWEST_SECONDS, (
        f"{who}'s answers took {median:.2f} s (median), {slowest:.2f} s (slowest) during the flood: "
        f"{[round(x, 2) for x in latencies]}"
    )
