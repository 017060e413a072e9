"""Benchmark of one scheduling cycle: `python benchmarks/plan_bench.py` prints CPU time per cycle."""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's code, not whichever one is installed

from machine import speed_line  # noqa: E402

from hai_airflow.scheduling import plan  # noqa: E402
from hai_airflow.scheduling.model import Job, Node, Quota, Snapshot, WorkerPlacement  # noqa: E402
from hai_airflow.scheduling.state import ClusterState  # noqa: E402
from hai_airflow.scheduling.usage import Usage  # noqa: E402

NOW = 1_700_000_000.0
TYPES = ("V100", "A100", "T4")
USERS = [f"user{i}" for i in range(60)]


def cluster(nodes: int) -> tuple[Node, ...]:
    return tuple(Node(f"n{i:04d}", TYPES[i % 3], 8, 64, 512) for i in range(nodes))


def running_jobs(nodes: tuple[Node, ...], rng: random.Random, busy: float) -> list[Job]:
    """Low-priority (and some high) jobs filling about `busy` of the GPUs, packed node by node."""
    jobs: list[Job] = []
    for n in nodes:
        used = 0
        while used < 8 and rng.random() < busy:
            size = min(rng.choice((1, 2, 4, 8)), 8 - used)
            size = 1 << (size.bit_length() - 1)
            user = rng.choice(USERS)
            jobs.append(Job(
                id=1_000_000 + len(jobs), user=user, group=f"g{USERS.index(user) % 6}", state="RUNNING",
                max_schedule=4 if rng.random() < 0.1 else 0, submitted_at=NOW - 90_000,
                gpus_per_worker=size, cpus_per_worker=size * 4, memory_gb_per_worker=size * 32,
                gpu_type=n.gpu_type, started_at=NOW - rng.uniform(60, 86_400),
                placement=(WorkerPlacement(n.name, tuple(range(used, used + size)), size * 4, size * 32),),
            ))
            used += size
    return jobs


def queued_jobs(count: int, rng: random.Random) -> list[Job]:
    """Mixed 1/2/4/8-GPU and multi-worker jobs, 20% high priority, some suspended, some any-type."""
    jobs = []
    for i in range(count):
        user = rng.choice(USERS)
        workers, gpus = rng.choice([(1, 1), (1, 2), (1, 4), (1, 8), (1, 8), (2, 8), (4, 8), (2, 4)])
        suspended = rng.random() < 0.05
        jobs.append(Job(
            id=i + 1, user=user, group=f"g{USERS.index(user) % 6}",
            state="SUSPENDED" if suspended else "PENDING",
            max_schedule=rng.choice((4, 8, 24)) if rng.random() < 0.2 else 0,
            submitted_at=NOW - rng.uniform(0, 36_000), workers=workers, gpus_per_worker=gpus,
            cpus_per_worker=gpus * 4, memory_gb_per_worker=gpus * 32,
            gpu_type=rng.choice((*TYPES, None)),
            suspended_at=NOW - 600 if suspended else None, suspended_seconds=300 if suspended else 0,
        ))
    return jobs


def scenario(nodes: int, queued: int, seed: int = 7, busy: float = 0.7) -> Snapshot:
    rng = random.Random(seed)
    cluster_nodes = cluster(nodes)
    jobs = running_jobs(cluster_nodes, rng, busy=busy) + queued_jobs(queued, rng)
    quota = Quota(groups={f"g{i}": (nodes * 8) // 4 for i in range(6)},
                  users={u: 64 if i % 3 else None for i, u in enumerate(USERS)})
    return Snapshot(cluster_nodes, tuple(jobs), quota)


def measure(snapshot: Snapshot, usage: Usage | None = None, *, repeats: int) -> tuple[float, Counter[str]]:
    """Least CPU seconds of one cycle (the figure least disturbed by other processes on a shared
    machine) and the decisions of the last one."""
    cpu = []
    decisions = plan(snapshot, NOW, usage)  # warm-up: first-call costs are not a cycle's
    for _ in range(repeats):
        start_cpu = time.process_time()
        decisions = plan(snapshot, NOW, usage)
        cpu.append(time.process_time() - start_cpu)
    return min(cpu), Counter(type(d).__name__ for d in decisions)


def kept(snapshot: Snapshot) -> tuple[Snapshot, Usage]:
    """The same cluster as the controller and the simulator hand it over: from a `ClusterState`, whose
    usage of the running jobs is kept between cycles instead of counted by each one."""
    state = ClusterState.load(snapshot.nodes, snapshot.jobs, snapshot.reservations, snapshot.quota)
    return state.snapshot(), state.usage


SIZES = [(100, 100), (100, 1_000), (100, 10_000), (1_000, 100), (1_000, 1_000), (1_000, 10_000)]
STRETCH = (10_000, 100_000)
TARGET_STATELESS_MS = 100.0
"""plan() alone, nothing carried between calls, at 10,000 queued x 1,000 nodes."""
TARGET_STRETCH_MS = 1000.0
"""A cycle through the kept state at 100,000 queued x 10,000 nodes."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7, help="cycles measured per figure")
    parser.add_argument("--no-stretch", action="store_true", help="skip 100,000 queued x 10,000 nodes")
    args = parser.parse_args()
    print(speed_line())
    print(f"{'nodes':>6} {'queued':>7} {'running':>8} {'stateless':>10} {'kept state':>11}  decisions")
    print(f"{'':>24} {'(CPU ms: least of ' + str(args.repeats) + ' cycles)':>22}")
    for nodes, queued in SIZES + ([] if args.no_stretch else [STRETCH]):
        snapshot = scenario(nodes, queued)
        running = sum(1 for j in snapshot.jobs if j.state == "RUNNING")
        stateless, kinds = measure(snapshot, repeats=args.repeats)
        with_state, _ = measure(*kept(snapshot), repeats=args.repeats)
        summary = " ".join(f"{k}={v}" for k, v in sorted(kinds.items()))
        figures = f"{stateless * 1000:>10.1f} {with_state * 1000:>11.1f}"
        print(f"{nodes:>6} {queued:>7} {running:>8} {figures}  {summary}", flush=True)
        if (nodes, queued) == (1_000, 10_000):
            verdict = "met" if stateless * 1000 <= TARGET_STATELESS_MS else "MISSED"
            print(f"  target: stateless <= {TARGET_STATELESS_MS:.0f} ms at 10,000 x 1,000: {verdict}")
        if (nodes, queued) == STRETCH:
            verdict = "met" if with_state * 1000 <= TARGET_STRETCH_MS else "MISSED"
            print(f"  stretch: kept state <= {TARGET_STRETCH_MS:.0f} ms at 100,000 x 10,000: {verdict}")


if __name__ == "__main__":
    main()
