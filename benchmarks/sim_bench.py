"""How fast `hai sim` replays a synthetic trace, then the policies side by side on that trace."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import typer
from gen_trace import TraceSpec, write_trace
from machine import speed_line

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's code, not whichever one is installed

from hai_airflow.cli.sim import sim  # noqa: E402
from hai_airflow.scheduling import POLICIES  # noqa: E402
from hai_airflow.sim import load_trace, simulate, summarize  # noqa: E402

TARGET_S = 60.0
"""Wall-clock goal for 10,000 jobs over 1,000 nodes under one policy."""


def speed(nodes: Path, jobs: Path, quotas: Path, policy: str, cycle_interval: float) -> None:
    began = time.perf_counter()
    trace = load_trace(nodes, jobs, quotas)
    loaded = time.perf_counter()
    summary = summarize(simulate(trace, policy, cycle_interval=cycle_interval))
    took = time.perf_counter() - began
    mode = f"a cycle every {cycle_interval:g} s" if cycle_interval else "a cycle at every event time"
    verdict = "met" if took < TARGET_S else "MISSED"
    print(f"policy {policy}, {mode}: load {loaded - began:.2f} s, simulate {summary.wall_s:.2f} s, "
          f"total {took:.2f} s (target {TARGET_S:.0f} s for 10,000 jobs: {verdict})")
    print(f"  simulated jobs per wall-clock second: {len(trace.jobs) / took:,.0f}; planner: "
          f"{summary.planner_cycles} cycles, median {summary.planner_ms_median or 0:.2f} ms, "
          f"max {summary.planner_ms_max or 0:.2f} ms, {summary.planner_cycles / took:.0f} cycles/s")


def compare(nodes: Path, jobs: Path, quotas: Path, policies: list[str], cycle_interval: float) -> None:
    """The side-by-side table exactly as `hai sim --compare` prints it."""
    app = typer.Typer()
    app.command()(sim)
    args = ["--nodes", str(nodes), "--jobs", str(jobs), "--config", str(quotas)]
    args += ["--compare", ",".join(policies), "--cycle-interval", str(cycle_interval)]
    print(f"hai sim --compare {','.join(policies)} --cycle-interval {cycle_interval:g}")
    began = time.perf_counter()
    app(args, standalone_mode=False)
    print(f"--compare of {len(policies)} policies took {time.perf_counter() - began:.1f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--load", type=float, default=TraceSpec.load)
    parser.add_argument("--policy", default="seed", help="policy of the timed runs")
    parser.add_argument(
        "--cycle-intervals", default="0,60", help="timed runs: seconds between planner cycles, 0 = each event"
    )
    parser.add_argument("--compare", default=",".join(POLICIES), help="policies for the table; '' skips it")
    parser.add_argument("--compare-cycle-interval", type=float, default=0.0, help="0 = exact")
    parser.add_argument("--out", type=Path, help="keep the trace here (default: a temporary directory)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hai-sim-bench-") as scratch:
        out = args.out or Path(scratch)
        spec = TraceSpec(jobs=args.jobs, nodes=args.nodes, seed=args.seed, load=args.load)
        paths = write_trace(spec, out)
        trace = load_trace(*paths)
        print(speed_line())
        print(f"trace: {len(trace.jobs)} jobs, {len(trace.nodes)} nodes, "
              f"{sum(n.gpus for n in trace.nodes)} GPUs, seed {args.seed}, load {args.load}")
        for interval in (float(i) for i in args.cycle_intervals.split(",") if i):
            speed(*paths, args.policy, interval)
        policies = [p for p in args.compare.split(",") if p]
        if policies:
            print()
            compare(*paths, policies, args.compare_cycle_interval)


if __name__ == "__main__":
    main()
