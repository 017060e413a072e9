"""The controller's planning cycle with 10,000 jobs queued behind 1,000 full nodes, on SQLite and PostgreSQL.

The real controller, store and planner, in this process: one cycle = read what changed (the change
feed), plan, write what the plan decided. The 1,000 machines of 8 GPUs cannot run here, so a stand-in
backend (below) says every instance started and none ends; the 1,000 running jobs are rows in the store.

Prints, per store: the cycle with nothing new (settled: the last plan only made jobs wait, so it does
not plan), the same cycle made to plan anyway (as it does every REPLAN_SECONDS), the cycle after a
burst of new submissions that wait anyway (the cluster is full: still settled, no plan), and after
such a burst and one job ending (a plan; median and range of the cycles timed, each) without and
with the forecaster thread at work beside the controller (alternated in blocks), the full
read of the store the controller no longer does per cycle (for comparison), and this process's
resident memory.

Run: .venv/bin/python benchmarks/cycle_bench.py [--queued 10000] [--nodes 1000] [--cycles 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from machine import speed_line  # noqa: E402

from hai_airflow.backends.common.base import Exit, Handle, Launch  # noqa: E402
from hai_airflow.scheduling.model import Node  # noqa: E402
from hai_airflow.server.config import parse_config  # noqa: E402
from hai_airflow.server.control.controller import Controller  # noqa: E402
from hai_airflow.server.control.mirror import read_all  # noqa: E402
from hai_airflow.server.process.context import ServerContext  # noqa: E402
from hai_airflow.server.provision import apply_config  # noqa: E402
from hai_airflow.server.store.database import Store  # noqa: E402
from hai_airflow.server.store.tables import InstanceRow, JobRow  # noqa: E402
from tests.support import postgres  # noqa: E402
from tests.support.live_server import TEST_CONFIG  # noqa: E402

TARGET_MS = 50.0
BLOCK = 5
"""Cycles timed in a row with the forecaster, then without it, alternately."""
TYPES = ("V100", "A100", "T4")


class StandIn:
    """A backend for machines that are not here: every start succeeds, nothing ends unless stopped."""

    name = "stand-in"
    on_exit = None

    def __init__(self) -> None:
        self.stopped: list[int] = []

    def inventory(self) -> list[Node] | None:
        return None

    def start(self, launch: Launch) -> Handle:
        return Handle(launch.instance_id, {"stand_in": True})

    def stop(self, instance_id: int, grace_seconds: int, notice: bool) -> None:
        self.stopped.append(instance_id)

    def poll(self) -> list[Exit]:
        ended, self.stopped = self.stopped, []
        return [Exit(i, 0, "stopped") for i in ended]

    def reattach(self, handles: list[Handle]) -> list[Exit]:
        return []

    def reap(self, instance_id: int, work_dir: Path) -> None:
        pass

    def read_log(self, instance_id: int, tail: int = 0) -> str:
        return ""

    def follow_log(self, instance_id: int) -> Iterator[str]:
        return iter(())

    def close(self) -> None:
        pass


def config_text(nodes: int) -> str:
    extra = "".join(
        f'\n[[nodes]]\nname = "m{i:05d}"\ngpu_type = "{TYPES[i % 3]}"\ngpus = 8\ncpus = 96\nmemory_gb = 768\n'
        for i in range(nodes - 1)
    )
    return TEST_CONFIG + extra


def job_row(i: int, state: str, now: float, gpu_type: str | None, gpus: int) -> JobRow:
    return JobRow(
        task_name=f"b{i}",
        mode="standalone",
        user_name=("alice", "bob", "dave")[i % 3],
        group_name=("vision", "vision", "nlp")[i % 3],
        state=state,
        max_schedule=0,
        spec=json.dumps(
            {
                "mode": "standalone",
                "task_name": f"b{i}",
                "code_path": "/tmp",
                "cmd": "true",
                "resource_pkg": 454,
            }
        ),
        workers=1,
        gpus_per_worker=gpus,
        cpus_per_worker=4.0 * gpus,
        memory_gb_per_worker=32.0 * gpus,
        gpu_type=gpu_type,
        elastic=False,
        submitted_at=now - 10_000 + i * 0.01,
        suspended_seconds=0.0,
        runtime_seconds=0.0,
        preemptions=0,
        instance_count=1 if state == "RUNNING" else 0,
        held=False,
        cancel_requested=False,
        reason="waiting for the scheduler",
        started_at=now - 5_000 if state == "RUNNING" else None,
    )


def fill(store: Store, nodes: list[Node], queued: int) -> None:
    """Every node full with one 8-GPU running job; `queued` 1-, 2- and 4-GPU jobs waiting behind them."""
    now = time.time()
    with store.write() as s:
        for i, n in enumerate(nodes):
            job = job_row(i, "RUNNING", now, n.gpu_type, 8)
            s.add(job)
            s.flush()
            placement = [{"node": n.name, "gpus": list(range(8)), "cpus": 32.0, "memory_gb": 256.0}]
            inst = InstanceRow(
                job_id=job.id,
                created_at=now,
                started_at=now,
                placement=json.dumps(placement),
                handle=json.dumps({"stand_in": True}),
                log_path="",
                work_dir="",
                model_dir="",
                grace_seconds=0,
            )
            s.add(inst)
            s.flush()
            job.current_instance_id = inst.id
        for i in range(queued):
            s.add(job_row(len(nodes) + i, "PENDING", now, TYPES[i % 3], (1, 2, 4)[i % 3]))


def analyze(store: Store) -> None:
    """Give PostgreSQL's planner statistics of the tables just filled, as its autovacuum would within a
    minute of such a change. This machine's PostgreSQL runs with autovacuum off, and without statistics
    the planner updates a few waiting jobs through the state index, reading all 10,000 of them (the
    server warns of it at start: `Store.upkeep_advice`)."""
    if not store.is_sqlite:
        with store.engine.connect() as conn:
            conn.exec_driver_sql("ANALYZE")
            conn.commit()


def cycle_ms(controller: Controller) -> float:
    began = time.perf_counter()
    controller.cycle()
    return (time.perf_counter() - began) * 1000


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bench(url: str, label: str, args: argparse.Namespace, home: Path) -> None:
    config = parse_config(config_text(args.nodes).replace("{home}", str(home)))
    store = Store(url)
    store.migrate()
    apply_config(store, config, list(config.nodes))
    with store.read() as s:
        nodes = list(read_all(s, config.server.policy).state.nodes)
    fill(store, nodes, args.queued)
    analyze(store)
    ctx = ServerContext(store=store, config=config, home=home, holder_id=f"bench:{label}")
    controller = Controller(ctx, StandIn())  # type: ignore[arg-type]
    controller.step(force=True)  # takes the lease, reads the store whole, writes every job's reason
    controller.cycle()
    idle = [cycle_ms(controller) for _ in range(args.cycles)]  # settled: nothing new, no plan
    replanned = []
    for _ in range(args.cycles):  # nothing new, planned anyway (as every REPLAN_SECONDS)
        controller.settled = None
        replanned.append(cycle_ms(controller))
    def burst(first: int) -> None:
        with store.write() as s:  # 16 one-GPU low-priority submissions, as the API would write them
            now = time.time()
            for i in range(16):
                s.add(job_row(first + i, "PENDING", now, TYPES[i % 3], 1))

    arrivals = []
    for k in range(args.cycles):
        burst(9_000_000 + k * 16)
        arrivals.append(cycle_ms(controller))
    def ended_one(k: int) -> float:
        burst(10_000_000 + k * 16)  # and one job ending, as an exit would
        running = next(iter(controller.follower.view().current.values()))
        controller.backend.stop(running.id, 0, False)
        controller.exits.record(controller.backend.poll())
        took = cycle_ms(controller)
        time.sleep(0.1)  # as between the controller's cycles: a forecaster thread gets its turn
        return took

    # Alternated in blocks: without the forecaster, and with its thread at work beside the controller.
    busy: list[float] = []
    forecasting: list[float] = []
    for block in range(0, args.cycles, BLOCK):
        size = min(BLOCK, args.cycles - block)  # args.cycles cycles of each
        busy += [ended_one(2 * block + k) for k in range(size)]
        controller.forecaster.start()
        try:
            forecasting += [ended_one(2 * block + size + k) for k in range(size)]
        finally:
            controller.forecaster.stop()
    forecasts = controller.forecaster.latest
    began = time.perf_counter()
    with store.read() as s:
        read_all(s, config.server.policy)
    full_ms = (time.perf_counter() - began) * 1000
    queued = len([j for j in controller.follower.view().snapshot.jobs if j.state in ("PENDING", "SUSPENDED")])
    timed = (idle, replanned, arrivals, busy, forecasting)
    verdict = "met" if all(statistics.median(c) <= TARGET_MS for c in timed) else "MISSED"
    print(
        f"{label}: {queued} queued x {args.nodes} nodes: cycle idle (settled, no plan) median "
        f"{statistics.median(idle):.1f} ms (range {min(idle):.1f}-{max(idle):.1f}), idle planned anyway "
        f"median {statistics.median(replanned):.1f} ms (range {min(replanned):.1f}-{max(replanned):.1f}), "
        f"after 16 submits that wait anyway median "
        f"{statistics.median(arrivals):.1f} ms (range {min(arrivals):.1f}-{max(arrivals):.1f}), "
        f"after 16 submits + 1 exit median "
        f"{statistics.median(busy):.1f} ms (range {min(busy):.1f}-{max(busy):.1f}), the same with the "
        f"forecaster at work median {statistics.median(forecasting):.1f} ms "
        f"(range {min(forecasting):.1f}-{max(forecasting):.1f}; its last forecast took "
        f"{forecasts.seconds if forecasts is not None else float('nan'):.2f} s); "
        f"target {TARGET_MS:.0f} ms for each: "
        f"{verdict}; a full read of the store {full_ms:.0f} ms (no longer per cycle); RSS {rss_mb():.0f} MB",
        flush=True,
    )
    store.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--stores", default="sqlite,postgresql")
    args = parser.parse_args(argv)
    print(speed_line(), flush=True)
    for label in args.stores.split(","):
        with tempfile.TemporaryDirectory(prefix="hai-cycle-bench-") as tmp:
            if label == "sqlite":
                bench(f"sqlite:///{tmp}/hai.db", label, args, Path(tmp))
                continue
            reason = postgres.unavailable_reason()
            if reason is not None:
                print(f"{label}: skipped ({reason})")
                continue
            with postgres.temporary_database("hai_cycle_bench") as url:
                bench(url, label, args, Path(tmp))


if __name__ == "__main__":
    main()
