"""hai serve throughput: submit -> process-started latency and submissions/s, on SQLite and PostgreSQL.

Run: .venv/bin/python benchmarks/server_bench.py [--jobs 50] [--clients 16] [--submissions 400]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hai_airflow.client import HaiClient  # noqa: E402
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


def throughput(server: LiveServer, code: Path, clients: int, total: int) -> float:
    """Submissions per second through the API with `clients` concurrent clients (jobs mostly queue)."""
    per_client = total // clients
    spec = StandaloneJobSpec(task_name="tp", code_path=str(code), cmd="sleep 600", resource_pkg=457)
    barrier = threading.Barrier(clients + 1)
    errors: list[BaseException] = []

    def run(n: int) -> None:
        with HaiClient(server=server.url, token=server.token) as c:
            c.whoami()  # connect before the clock starts
            barrier.wait()
            try:
                for i in range(per_client):
                    c.submit(spec, client_key=f"tp-{n}-{i}")
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
    return per_client * clients / elapsed


def bench(store: str, env: dict[str, str], args: argparse.Namespace) -> tuple[list[float], float]:
    with tempfile.TemporaryDirectory(prefix="hai-bench-") as tmp:
        code = Path(tmp) / "code"
        code.mkdir()
        with start_server(Path(tmp) / "home", TEST_CONFIG, env) as server:
            lat = latency(server, code, args.jobs)
            rate = throughput(server, code, args.clients, args.submissions)
    return lat, rate


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=50, help="jobs for the latency median")
    parser.add_argument("--clients", type=int, default=16, help="concurrent API clients")
    parser.add_argument("--submissions", type=int, default=400, help="submissions for the throughput")
    args = parser.parse_args()
    stores: list[tuple[str, dict[str, str]]] = [("sqlite", {})]
    reason = postgres.unavailable_reason()
    pg_cm = None
    if reason is None:
        pg_cm = postgres.temporary_database("hai_bench")
        stores.append(("postgresql", {"HAI_DATABASE_URL": pg_cm.__enter__()}))
    else:
        print(f"PostgreSQL skipped: {reason}", file=sys.stderr)
    print(f"{'store':<11} {'submit->started median':>23} {'p90':>8} {'submissions/s':>14}")
    try:
        for name, env in stores:
            lat, rate = bench(name, env, args)
            p90 = statistics.quantiles(lat, n=10)[-1]
            median = statistics.median(lat)
            print(f"{name:<11} {median * 1000:>20.1f} ms {p90 * 1000:>5.1f} ms {rate:>14.1f}", flush=True)
    finally:
        if pg_cm is not None:
            pg_cm.__exit__(None, None, None)
    print(f"({args.jobs} jobs one at a time for latency; ", end="")
    print(f"{args.submissions} submissions from {args.clients} clients)")


if __name__ == "__main__":
    main()
