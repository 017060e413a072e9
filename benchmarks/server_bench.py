"""hai serve: submit -> process-started latency, submissions/s, and the server's memory and planner
cycle with 10,000 jobs in the store, on SQLite and PostgreSQL; then the same under load: 10,000
jobs queued behind 100 full nodes while 16 clients keep submitting.

Run: .venv/bin/python benchmarks/server_bench.py [--jobs 50] [--clients 16] [--submissions 400]
     [--store-jobs 10000] [--load-nodes 100] [--load-submissions 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cycle_bench import analyze, config_text, job_row  # noqa: E402
from machine import speed_line  # noqa: E402

from hai_airflow.client import HaiClient  # noqa: E402
from hai_airflow.scheduling.settled import REPLAN_SECONDS  # noqa: E402
from hai_airflow.server.store.database import Store  # noqa: E402
from hai_airflow.spec import StandaloneJobSpec  # noqa: E402
from tests.support import postgres  # noqa: E402
from tests.support.live_server import TEST_CONFIG, LiveServer, start_server  # noqa: E402

STARTED = 'date +%s.%N > "$HAI_MODEL_DIR/started"'


def latency(server: LiveServer, code: Path, jobs: int) -> list[float]:
    """Seconds from sending the submit to the job's command running, one job at a time."""
    out = []
    with server.client() as c:
        for i in range(jobs):
            spec = StandaloneJobSpec(task_name=f"lat{i}", code_path=str(code), cmd=STARTED, resource_pkg=454)
            t0 = time.time()
            job = c.submit(spec)
            marker = server.home / "jobs" / str(job.id) / "model" / "started"
            deadline = time.monotonic() + 30
            while not (marker.exists() and marker.read_text().strip()):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"job {job.id} did not start: {c.job(job.id).reason}")
                time.sleep(0.002)
            out.append(float(marker.read_text()) - t0)
            c.wait(job.id, since_state="RUNNING", timeout=10)
    return out


def throughput(server: LiveServer, code: Path, clients: int, total: int, tag: str = "tp") -> float:
    """Submissions per second through the API with `clients` concurrent clients (jobs mostly queue)."""
    spec = StandaloneJobSpec(task_name="tp", code_path=str(code), cmd="sleep 600", resource_pkg=457)
    barrier = threading.Barrier(clients + 1)
    errors: list[BaseException] = []

    def run(n: int) -> None:
        with HaiClient(server=server.url, token=server.token) as c:
            c.whoami()  # connect before the clock starts
            barrier.wait()
            try:
                for i in range(total // clients + (n < total % clients)):
                    c.submit(spec, client_key=f"{tag}-{n}-{i}")
            except BaseException as e:
                errors.append(e)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return total / elapsed


def rss_mb(pid: int) -> float:
    """Resident memory of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


SETTLED = "hai_planner_settled_cycles_total"


def metric(server: LiveServer, *names: str) -> list[float]:
    """Samples of the server's Prometheus metrics (0 for one not reported yet)."""
    admin = {"Authorization": f"Bearer {server.token}"}  # /metrics is for platform admins and Prometheus
    text = httpx.get(f"{server.url}/metrics", headers=admin, timeout=10).text
    figures = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in names:
            figures[name] = float(value)
    return [figures.get(name, 0.0) for name in names]


def planner_cycle(server: LiveServer) -> tuple[int, float]:
    """Cycles so far and their summed seconds."""
    count, total = metric(server, "hai_planner_cycle_seconds_count", "hai_planner_cycle_seconds_sum")
    return int(count), total


def until_settled(server: LiveServer, timeout: float = 300) -> None:
    """Wait until a cycle skips its plan: the last plan has taken every job in and only made jobs wait."""
    (before,) = metric(server, SETTLED)
    deadline = time.monotonic() + timeout
    while metric(server, SETTLED)[0] <= before:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the controller did not settle within {timeout:.0f} s")
        time.sleep(0.2)


@dataclass
class Figures:
    latency: list[float]
    rate: float
    rss_start_mb: float
    rss_full_mb: float
    stored: int
    cycle_full_ms: float
    cycles_full: int
    plans_full: int


def bench(store: str, env: dict[str, str], args: argparse.Namespace) -> Figures:
    # The supervisors of the jobs killed on the way out may still write their exit files as it goes.
    with tempfile.TemporaryDirectory(prefix="hai-bench-", ignore_cleanup_errors=True) as tmp:
        code = Path(tmp) / "code"
        code.mkdir()
        with start_server(Path(tmp) / "home", TEST_CONFIG, env) as server:
            assert server.proc is not None
            rss_start = rss_mb(server.proc.pid)
            lat = latency(server, code, args.jobs)
            rate = throughput(server, code, args.clients, args.submissions)
            # Fill the store: everything queues behind the 8-GPU jobs already running.
            stored = args.jobs + args.submissions
            fill = args.store_jobs - stored
            if fill > 0:
                throughput(server, code, args.clients, fill, tag="fill")
                stored += fill
            if "HAI_DATABASE_URL" in env:
                db = Store(env["HAI_DATABASE_URL"])
                analyze(db)
                db.dispose()
            # Time the cycles with the store full, once a plan has said why each new job waits. A
            # settled cluster is planned again every REPLAN_SECONDS: a window of 2.5 of those, begun
            # just after a plan, holds at least two of them wherever it starts (a 10 s window held
            # one or none, as its end fell on the next plan or just before it).
            until_settled(server)
            count0, sum0 = planner_cycle(server)
            (settled0,) = metric(server, SETTLED)
            time.sleep(2.5 * REPLAN_SECONDS)
            count1, sum1 = planner_cycle(server)
            (settled1,) = metric(server, SETTLED)
            cycles = count1 - count0
            cycle_ms = (sum1 - sum0) / max(cycles, 1) * 1000
            rss_full = rss_mb(server.proc.pid)
            # Stopped first, so leaving does not cancel 10,000 queued jobs one by one (the store is
            # thrown away); the jobs it started are killed on the way out.
            server.stop()
    plans = cycles - int(settled1 - settled0)
    return Figures(lat, rate, rss_start, rss_full, stored, cycle_ms, cycles, plans)


@dataclass
class UnderLoad:
    nodes: int
    queued: int
    rate: float
    cycles: int
    settled: int
    cycle_ms: float
    rss_mb: float


def under_load(env: dict[str, str], args: argparse.Namespace) -> UnderLoad:
    """Every node full with a running 8-GPU job, `store_jobs` more queued behind them (written to the
    store directly, as a backlog), then `load_submissions` submissions from the clients while the
    controller keeps planning: the submission rate and the mean planner cycle over that window."""
    with tempfile.TemporaryDirectory(prefix="hai-bench-load-", ignore_cleanup_errors=True) as tmp:
        code = Path(tmp) / "code"
        code.mkdir()
        home = Path(tmp) / "home"
        config = config_text(args.load_nodes).replace('gpu_type = "A100"', 'gpu_type = "V100"')
        config = config.replace('gpu_type = "T4"', 'gpu_type = "V100"')
        with start_server(home, config, env) as server:
            assert server.proc is not None
            busy = StandaloneJobSpec(
                task_name="busy", code_path=str(code), cmd="sleep 3600", resource_pkg=457
            )
            with server.client() as c:
                ids = [c.submit(busy).id for _ in range(args.load_nodes)]
                deadline = time.monotonic() + 120
                while sum(c.job(i).state == "RUNNING" for i in ids) < len(ids):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the nodes did not fill up within 120 s")
                    time.sleep(0.5)
            store = Store(env.get("HAI_DATABASE_URL") or f"sqlite:///{home / 'hai.db'}")
            with store.write() as s:
                now = time.time()
                for i in range(args.store_jobs):
                    row = job_row(i, "PENDING", now, "V100", (1, 2, 4)[i % 3])
                    row.spec = row.spec.replace('"/tmp"', f'"{code}"')
                    s.add(row)
            analyze(store)
            store.dispose()
            until_settled(server)  # the controller has taken the backlog in and said why each job waits
            count0, sum0 = planner_cycle(server)
            (settled0,) = metric(server, SETTLED)
            rate = throughput(server, code, args.clients, args.load_submissions, tag="load")
            count1, sum1 = planner_cycle(server)
            (settled1,) = metric(server, SETTLED)
            rss = rss_mb(server.proc.pid)
            server.stop()
    cycles = count1 - count0
    mean_ms = (sum1 - sum0) / max(cycles, 1) * 1000
    return UnderLoad(args.load_nodes, args.store_jobs, rate, cycles, int(settled1 - settled0), mean_ms, rss)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=50, help="jobs for the latency median")
    parser.add_argument("--clients", type=int, default=16, help="concurrent API clients")
    parser.add_argument("--submissions", type=int, default=400, help="submissions for the throughput")
    parser.add_argument(
        "--store-jobs", type=int, default=10_000, help="jobs in the store for the memory figure"
    )
    parser.add_argument("--load-nodes", type=int, default=100, help="full nodes for the run under load")
    parser.add_argument("--load-submissions", type=int, default=2000, help="submissions under load")
    args = parser.parse_args()
    print(speed_line(), flush=True)
    stores: list[tuple[str, dict[str, str]]] = [("sqlite", {})]
    reason = postgres.unavailable_reason()
    pg_cm = None
    if reason is None:
        pg_cm = postgres.temporary_database("hai_bench")
        stores.append(("postgresql", {"HAI_DATABASE_URL": pg_cm.__enter__()}))
    else:
        print(f"PostgreSQL skipped: {reason}", file=sys.stderr)
    print(f"{'store':<11} {'submit->started p50':>19} {'p95':>9} {'submissions/s':>14} "
          f"{'RSS idle':>9} {'RSS full':>9} {'jobs stored':>12} {'cycle, full':>12} {'cycles (plans)':>15}")
    try:
        for name, env in stores:
            f = bench(name, env, args)
            p95 = statistics.quantiles(f.latency, n=20)[-1]
            median = statistics.median(f.latency)
            print(f"{name:<11} {median * 1000:>16.1f} ms {p95 * 1000:>6.1f} ms {f.rate:>14.1f} "
                  f"{f.rss_start_mb:>6.0f} MB {f.rss_full_mb:>6.0f} MB {f.stored:>12,} "
                  f"{f.cycle_full_ms:>9.1f} ms {f.cycles_full:>9} ({f.plans_full})", flush=True)
        print()
        for name, _ in stores:
            if name == "postgresql":  # a database of its own: the first server's token key is not ours
                with postgres.temporary_database("hai_bench_load") as url:
                    u = under_load({"HAI_DATABASE_URL": url}, args)
            else:
                u = under_load({}, args)
            verdict = "met" if u.cycle_ms <= 50 and u.rate >= 400 else "MISSED"
            print(f"{name:<11} under load: {u.queued:,} queued behind {u.nodes} full nodes, "
                  f"{args.load_submissions} submissions from {args.clients} clients: {u.rate:.1f}/s, "
                  f"planner cycle mean {u.cycle_ms:.1f} ms over {u.cycles} cycles ({u.settled} settled: "
                  f"no plan), RSS {u.rss_mb:.0f} MB "
                  f"(targets <= 50 ms and >= 400/s: {verdict})", flush=True)
    finally:
        if pg_cm is not None:
            pg_cm.__exit__(None, None, None)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"(load average {load} at the end on {os.cpu_count()} CPUs; "
          f"{args.jobs} jobs one at a time for latency; {args.submissions} submissions from {args.clients} "
          f"clients for the rate; RSS of the server process when started and with the store full; "
          f"mean planner cycle with the store full, over {2.5 * REPLAN_SECONDS:.0f} s: settled cycles "
          f"and the plans made every {REPLAN_SECONDS:.0f} s)")


if __name__ == "__main__":
    main()
