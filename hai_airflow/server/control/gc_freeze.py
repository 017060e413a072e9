"""The kept cluster state and CPython's garbage collector.

A controller keeps a few objects per unfinished job for as long as the job waits or runs: at 10,000
queued jobs, hundreds of thousands of long-lived objects. A full collection scans every one of them,
and a plan's short-lived decisions set one off about one cycle in twenty: a pause of 100-170 ms in
the middle of a cycle of 50. After each full read of the store, what survives it is moved out of the
collector's sight (`gc.freeze`). Reference counting still frees those objects when a later read
replaces them; what it cannot free (a reference cycle among them) is handed back to the collector at
the next full read (`gc.unfreeze`) and collected there, so nothing is kept longer than one interval
between full reads.
"""

from __future__ import annotations

import gc

FREEZE_AT_JOBS = 1_000
"""Below this many unfinished jobs a full collection is short and the freeze is not worth its own
collection."""


def settle(jobs: int) -> None:
    """After a full read holding `jobs` unfinished jobs: collect once and freeze the survivors (the
    previously frozen ones collected with them)."""
    if jobs < FREEZE_AT_JOBS:
        return
    gc.unfreeze()
    gc.collect()
    gc.freeze()
