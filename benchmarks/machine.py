"""How fast this machine is now. A shared VM's speed moves from hour to hour (by up to 2x on this
project's development machine), so every benchmark prints this beside its figures: two runs are
comparable only when their machine figures are close.

Run: .venv/bin/python benchmarks/machine.py
"""

from __future__ import annotations

import statistics
import time

LOOP = 10_000_000
RUNS = 5


def loop_seconds() -> float:
    """CPU seconds of a fixed pure-Python loop (`LOOP` additions); lower is faster."""
    began = time.process_time()
    total = 0
    for i in range(LOOP):
        total += i
    return time.process_time() - began


def speed_line() -> str:
    """The loop's median and range over `RUNS` runs: its speed moves even from second to second."""
    runs = [loop_seconds() for _ in range(RUNS)]
    return (
        f"machine: {LOOP:,} Python additions took {statistics.median(runs):.2f} s of CPU "
        f"({min(runs):.2f}-{max(runs):.2f} over {RUNS} runs; lower is faster)"
    )


if __name__ == "__main__":
    print(speed_line())
