"""Merging workers' timestamped container logs into one instance log."""

from __future__ import annotations

from hai_airflow.backends.docker_logs import last_lines, merge


def test_workers_interleave_by_time_even_when_the_engine_trims_trailing_zeros() -> None:
    # "…00.5Z" is later than "…00.123456789Z" although it sorts first as text.
    w0 = b"2026-01-01T00:00:00.5Z second\n2026-01-01T00:00:01Z fourth\n"
    w1 = b"2026-01-01T00:00:00.123456789Z first\n2026-01-01T00:00:00.9Z third\n"
    assert merge([w0, w1]) == "[worker 1] first\n[worker 0] second\n[worker 1] third\n[worker 0] fourth\n"


def test_one_worker_keeps_its_own_order_and_no_prefix() -> None:
    # stdout and stderr are stamped by separate readers: a worker's order is kept as the engine gave it.
    raw = b"2026-01-01T00:00:02Z out\n2026-01-01T00:00:01Z err\n2026-01-01T00:00:03Z no newline"
    assert merge([raw]) == "out\nerr\nno newline\n"
    assert last_lines(merge([raw]), 2) == "err\nno newline\n"
