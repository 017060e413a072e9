"""The kept cluster state and CPython's garbage collector.

A controller keeps a few objects per unfinished job for as long as the job waits or runs: at 10,000
queued jobs, hundreds of thousands of long-lived objects. A full collection scans every one of them,
and a plan's short-lived decisions set one off about one cycle in twenty: a pause of 100-170 ms in
the middle of a cycle of 50. After each full read of the store, what survives it is moved out of the
collector's sight (`gc.freeze`). Reference counting still frees those objects when a later read
replaces them; what it cannot free (a reference cycle among them) is handed back to the collector at
the next full read (`gc.unfreeze`) and collected there, so nothing is kept longer than one interval
between full reads.

The youngest generation is also collected less often while the state is large (`YOUNG_PER_JOB`): a
plan makes a few short-lived objects per queued job (queue keys, decisions), and at the default of
one young collection per 700 allocations the collector scans them, and moves them to older
generations to scan again, although reference counting frees nearly all of them when the cycle ends.
"""

from __future__ import annotations

import gc

FREEZE_AT_JOBS = 1_000
"""Below this many unfinished jobs a full collection is short and the freeze is not worth its own
collection."""

YOUNG_PER_JOB = 4
"""From FREEZE_AT_JOBS, the youngest generation is collected after this many allocations per
unfinished job (instead of CPython's default), about what one plan allocates."""

DEFAULT_YOUNG = gc.get_threshold()[0]


def settle(jobs: int) -> None:
    """After a full read holding `jobs` unfinished jobs: collect once and freeze the survivors (the
    previously frozen ones collected with them), and size the youngest generation to the state."""
    _, older, oldest = gc.get_threshold()
    if jobs < FREEZE_AT_JOBS:
        gc.set_threshold(DEFAULT_YOUNG, older, oldest)
        return
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    gc.set_threshold(max(DEFAULT_YOUNG, YOUNG_PER_JOB * jobs), older, oldest)
