"""Two `hai serve` processes on one PostgreSQL database: how soon a job submitted through the standby
is seen started through the standby.

The leader's controller starts the job; the standby's API took the submit and answers the long-poll.
Each must learn of the other's commit: on the store's channel (LISTEN/NOTIFY) at once, else on its
next tick. Each job is `sleep 30` on one GPU and is cancelled before the next is submitted.

Prints the median, min and max over `--jobs` submissions (seconds from the submit call to the
long-poll's answer that the job left PENDING).

Run: .venv/bin/python benchmarks/standby_bench.py [--jobs 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hai_airflow.spec import StandaloneJobSpec  # noqa: E402
from tests.support import postgres  # noqa: E402
from tests.support.live_server import TEST_CONFIG, TOKENS, start_server  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20, help="submissions timed")
    args = parser.parse_args()
    reason = postgres.unavailable_reason()
    if reason is not None:
        print(f"standby_bench: skipped, {reason}")
        return 0
    with postgres.temporary_database("hai_standby") as url, tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        code = home / "code"
        code.mkdir()
        shared = {"HAI_DATABASE_URL": url, "HAI_TOKEN_KEY_FILE": str(home / "token.key")}
        with (
            start_server(home / "leader", TEST_CONFIG, shared) as leader,
            start_server(home / "standby", TEST_CONFIG, shared) as standby,
        ):
            assert leader.health()["controller_active"] and not standby.health()["controller_active"]
            client = standby.client(TOKENS["alice"])
            took = []
            for _ in range(args.jobs):
                spec = StandaloneJobSpec(task_name="t", code_path=str(code), cmd="sleep 30", resource_pkg=454)
                start = time.monotonic()
                job = client.submit(spec)
                seen = job
                while seen.state == "PENDING":
                    seen = client.wait(job.id, since_state="PENDING", timeout=10)
                took.append(time.monotonic() - start)
                client.cancel(job.id)
                time.sleep(0.3)
    ms = sorted(t * 1000 for t in took)
    print(
        f"submit on the standby -> seen started on the standby: median {statistics.median(ms):.0f} ms "
        f"(min {ms[0]:.0f}, max {ms[-1]:.0f}; {len(ms)} jobs, PostgreSQL)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
