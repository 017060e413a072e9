"""Horovod's `hvd.init()` under the platform's rank launcher beside `horovodrun --gloo`, in one run.

The same script runs as 4 ranks on this machine twice per round: under `horovodrun --gloo -np 4`, and
under the launcher exactly as the local backend starts a per-gpu worker of a distributed job (its argv
and rank environment from `workerenv`: one worker of 4 virtual GPUs, the gang on the loopback
interface, worker 0 serving the gloo rendezvous). Each rank times its first `hvd.init()` and then five
`hvd.shutdown(); hvd.init()` cycles; a run's figure is its slowest rank's, since a collective waits
for every rank. Rounds alternate the two launchers so both see the machine's same hour.

Prints the median and range of 3 runs of each, side by side, and their ratio (target: the launcher
within 1.2x of horovodrun).

Run: .venv/bin/python benchmarks/hvd_init_bench.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from machine import speed_line  # noqa: E402

from hai_airflow.backends.common import ranks  # noqa: E402
from hai_airflow.backends.common.workerenv import (  # noqa: E402
    MASTER_ADDR,
    Gang,
    free_port,
    gang_env,
    launcher_argv,
    worker_slots,
)
from hai_airflow.scheduling.model import WorkerPlacement  # noqa: E402

RANKS = 4
CYCLES = 5
TARGET = 1.2
TIMEOUT = 300.0
ATTEMPTS = 5
BIN = Path(sys.executable).parent
RANK_SCRIPT = f"""\
import json, os, time
import horovod.torch as hvd

began = time.perf_counter()
hvd.init()
first = time.perf_counter() - began
began = time.perf_counter()
for _ in range({CYCLES}):
    hvd.shutdown()
    hvd.init()
cycles = time.perf_counter() - began
out = os.path.join(os.environ["HVD_BENCH_OUT"], f"{{hvd.rank()}}.json")
with open(out, "w") as f:
    json.dump({{"size": hvd.size(), "first": first, "cycles": cycles}}, f)
hvd.shutdown()
"""
"""Imports torch and Horovod before the clock starts: only the rendezvous and gloo's mesh are timed."""

Run = Callable[[Path, dict[str, str]], list[str]]
"""(script, environment to complete) -> the argv that starts the 4 ranks."""


def horovodrun(script: Path, env: dict[str, str]) -> list[str]:
    """Horovod's own launcher and rendezvous server, on this machine."""
    return [str(BIN / "horovodrun"), "--gloo", "-np", str(RANKS), "-H", f"localhost:{RANKS}",
            str(BIN / "python"), str(script)]  # fmt: skip


def launcher(script: Path, env: dict[str, str]) -> list[str]:
    """The platform's launcher as the local backend starts worker 0 of a 1-worker, 4-GPU per-gpu job."""
    (slot,) = worker_slots((WorkerPlacement("node1", tuple(range(RANKS))),))
    gang = Gang(MASTER_ADDR, free_port(), MASTER_ADDR, free_port(), "lo", MASTER_ADDR)
    env.update(gang_env(slot, 1, gang))
    return launcher_argv(f"exec python3 {script}", slot, gang)


def one_run(run: Run, script: Path, tmp: Path) -> tuple[float, float] | str:
    """(first init, five cycles) in seconds, each the slowest rank's; or why the run failed."""
    work = Path(tempfile.mkdtemp(dir=tmp))
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp), "OMP_NUM_THREADS": "1",
           "HVD_BENCH_OUT": str(work)}  # fmt: skip
    argv = run(script, env)
    log = work / "log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, cwd=work, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            code = proc.wait(timeout=TIMEOUT)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    reports = [json.loads(p.read_text()) for p in work.glob("*.json")]
    if code == 0 and len(reports) == RANKS and {r["size"] for r in reports} == {RANKS}:
        return max(r["first"] for r in reports), max(r["cycles"] for r in reports)
    lines = log.read_text().splitlines()
    return next((line for line in lines if "what()" in line), f"exit code {code}: {lines[-1:]}")


def timed(run: Run, script: Path, tmp: Path, failed: list[str]) -> tuple[float, float]:
    """One run's figures; a run that fails is recorded in `failed` and run again, `ATTEMPTS` times at most."""
    for _ in range(ATTEMPTS):
        figures = one_run(run, script, tmp)
        if not isinstance(figures, str):
            return figures
        failed.append(figures)
    sys.exit(f"hvd_init_bench: {run.__name__} failed {ATTEMPTS} times; the last: {failed[-1]}")


def peer_check_line() -> str:
    """What the store's peer check costs one request (Horovod opens a connection per request), by each way
    of finding the peer's socket, with /proc/net/tcp as long as the runs above left it."""
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_connection(server.getsockname()) as peer,
    ):
        costs = {}
        for owner in (ranks._owner_by_proc, ranks._owner_by_diag):
            runs = []
            for _ in range(20):
                began = time.perf_counter()
                owner(peer.getsockname(), server.getsockname())
                runs.append(time.perf_counter() - began)
            costs[owner.__name__] = statistics.median(runs) * 1000
    with open("/proc/net/tcp") as f:
        sockets = len(f.readlines()) - 1
    return (
        f"peer check per request, median of 20: reading /proc/net/tcp ({sockets:,} sockets) "
        f"{costs['_owner_by_proc']:.2f} ms; sock_diag lookup {costs['_owner_by_diag']:.3f} ms"
    )


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each launcher")
    args = parser.parse_args()
    if not (BIN / "horovodrun").exists():
        print("hvd_init_bench: skipped, Horovod is not installed here (make provision installs it)")
        return 0
    print(speed_line())
    figures: dict[str, list[tuple[float, float]]] = {"horovodrun": [], "launcher": []}
    failed: dict[str, list[str]] = {"horovodrun": [], "launcher": []}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        script = tmp / "hvd_init.py"
        script.write_text(RANK_SCRIPT)
        for _ in range(args.runs):
            for run in (horovodrun, launcher):
                figures[run.__name__].append(timed(run, script, tmp, failed[run.__name__]))
    print(f"\nhvd.init() of {RANKS} ranks on one worker; median (range) of {args.runs} runs, slowest rank")
    print(f"{'':<26}{'horovodrun --gloo':>24}{'hai launcher':>24}{'ratio':>8}")
    for i, what in enumerate(("first hvd.init()", f"{CYCLES} x shutdown + init")):
        theirs = [f[i] for f in figures["horovodrun"]]
        ours = [f[i] for f in figures["launcher"]]
        ratio = statistics.median(ours) / statistics.median(theirs)
        verdict = "met" if ratio <= TARGET else "NOT met"
        print(f"{what:<26}{spread(theirs):>24}{spread(ours):>24}{ratio:>7.2f}x  (<= {TARGET}x: {verdict})")
    print(peer_check_line())
    for name, errors in failed.items():
        if errors:
            print(f"{name}: {len(errors)} failed run(s) not counted, run again; first: {errors[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
