"""Benchmark of one scheduling cycle: `python benchmarks/plan_bench.py` prints CPU time per cycle."""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import Counter
from dataclasses import replace

from hai_airflow.scheduling import plan
from hai_airflow.scheduling.model import Job, Node, Quota, Snapshot, WorkerPlacement

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


def scenario(nodes: int, queued: int, seed: int = 7) -> Snapshot:
    rng = random.Random(seed)
    cluster_nodes = cluster(nodes)
    jobs = running_jobs(cluster_nodes, rng, busy=0.7) + queued_jobs(queued, rng)
    quota = Quota(groups={f"g{i}": (nodes * 8) // 4 for i in range(6)},
                  users={u: 64 if i % 3 else None for i, u in enumerate(USERS)})
    return Snapshot(cluster_nodes, tuple(jobs), quota)


def copied(snapshot: Snapshot) -> Snapshot:
    """The same snapshot made of new objects, as the server reads it from the store every cycle."""
    return Snapshot(
        tuple(replace(n) for n in snapshot.nodes),
        tuple(replace(j) for j in snapshot.jobs),
        snapshot.quota,
        snapshot.reservations,
        snapshot.policy,
    )


def measure(snapshot: Snapshot, repeats: int, reuse: bool) -> tuple[float, float, Counter[str]]:
    """Median wall seconds and least CPU seconds of one cycle (the least is the figure least disturbed
    by other processes on a shared machine).

    With `reuse` every cycle gets the very same node and job objects, as in `hai sim`, where the
    planner only recounts the jobs that changed; otherwise each cycle gets new ones, as from the
    server's store, and the planner counts everything afresh.
    """
    wall, cpu = [], []
    decisions = plan(snapshot, NOW)  # warm-up: first-call costs are not a cycle's
    for _ in range(repeats):
        given = snapshot if reuse else copied(snapshot)
        start, start_cpu = time.perf_counter(), time.process_time()
        decisions = plan(given, NOW)
        cpu.append(time.process_time() - start_cpu)
        wall.append(time.perf_counter() - start)
    return statistics.median(wall), min(cpu), Counter(type(d).__name__ for d in decisions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7, help="cycles measured per figure")
    args = parser.parse_args()
    print(f"{'nodes':>6} {'queued':>7} {'running':>8} {'new objects':>12} {'same objects':>13}  decisions")
    print(f"{'':>24} {'(server)':>12} {'(simulator)':>13}  (CPU ms: least of {args.repeats} cycles)")
    for nodes, queued in [(100, 100), (100, 1_000), (100, 10_000),
                          (1_000, 100), (1_000, 1_000), (1_000, 10_000)]:
        snapshot = scenario(nodes, queued)
        running = sum(1 for j in snapshot.jobs if j.state == "RUNNING")
        _, fresh, kinds = measure(snapshot, args.repeats, reuse=False)
        _, reused, _ = measure(snapshot, args.repeats, reuse=True)
        summary = " ".join(f"{k}={v}" for k, v in sorted(kinds.items()))
        print(f"{nodes:>6} {queued:>7} {running:>8} {fresh * 1000:>12.1f} {reused * 1000:>13.1f}  {summary}")


if __name__ == "__main__":
    main()
