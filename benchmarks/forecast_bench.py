"""Benchmark of one queue forecast: `python benchmarks/forecast_bench.py` prints the CPU time (and the
wall time) of a forecast (runtime estimates, then the planner run forward) at 10,000 queued x 1,000
full nodes, as the forecaster thread makes it."""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's code, not whichever one is installed

from machine import speed_line  # noqa: E402
from plan_bench import NOW, USERS, scenario  # noqa: E402

from hai_airflow.scheduling.model import PLACED, Snapshot  # noqa: E402
from hai_airflow.scheduling.runtime import FinishedRun, RuntimeFacts, RuntimeHistory  # noqa: E402
from hai_airflow.server.control import gc_freeze  # noqa: E402
from hai_airflow.server.jobs.queue_forecast import forecast_queue  # noqa: E402

TASKS = ("resnet", "bert", "gpt", "vit", "t5", "sweep")
TARGET_SECONDS = 2.0
"""One forecast at 10,000 queued x 1,000 nodes (issue 42)."""


def facts_and_history(snapshot: Snapshot, seed: int = 11) -> tuple[dict[int, RuntimeFacts], RuntimeHistory]:
    """Per job a task name (a fifth with a time limit) and the run time so far; 5,000 finished runs."""
    rng = random.Random(seed)
    facts = {
        j.id: RuntimeFacts(
            job_id=j.id, user=j.user, group=j.group, task_name=rng.choice(TASKS),
            time_limit_seconds=rng.choice((3600, 4 * 3600, 12 * 3600)) if rng.random() < 0.2 else None,
            seconds_run=NOW - j.started_at if j.state in PLACED and j.started_at is not None else 0.0,
        )
        for j in snapshot.jobs
    }
    runs = [FinishedRun(u, f"g{USERS.index(u) % 6}", rng.choice(TASKS), rng.lognormvariate(8.5, 1.0))
            for u in (rng.choice(USERS) for _ in range(5000))]
    return facts, RuntimeHistory.of(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3, help="forecasts measured")
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--queued", type=int, default=10_000)
    args = parser.parse_args()
    print(speed_line())
    snapshot = scenario(args.nodes, args.queued, busy=1.0)  # every node full: the queue waits
    facts, history = facts_and_history(snapshot)
    queued = sum(1 for j in snapshot.jobs if j.state not in PLACED)
    gc_freeze.settle(len(snapshot.jobs))  # as the server leaves its kept state after a full read
    seconds = []
    for _ in range(args.runs):
        began, began_cpu = time.perf_counter(), time.process_time()
        result = forecast_queue(snapshot, facts, history, NOW, budget_seconds=None)
        seconds.append(time.process_time() - began_cpu)
        wall = time.perf_counter() - began
        reached = sum(1 for f in result.jobs.values() if f.start_at is not None)
        print(f"  forecast: {seconds[-1]:.2f} s of CPU ({wall:.2f} s wall); {reached:,} of {queued:,} queued "
              f"jobs given a start; horizon {(result.horizon - NOW) / 3600:.1f} h", flush=True)
    median = statistics.median(seconds)
    print(f"forecast, {args.queued:,} queued x {args.nodes:,} nodes: {median:.2f} s of CPU "
          f"({min(seconds):.2f}-{max(seconds):.2f} over {args.runs} runs)")
    verdict = "met" if median <= TARGET_SECONDS else "MISSED"
    print(f"  target: <= {TARGET_SECONDS:.0f} s at 10,000 x 1,000: {verdict}")


if __name__ == "__main__":
    main()
