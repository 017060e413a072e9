"""How fast `hai sim` replays a synthetic trace, then the policies side by side on that trace, then the
fair-share term on and off: on that trace, on Alibaba's GPU trace when given, and on Alibaba's with one
user's flood of low-priority jobs added."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import typer
from alibaba_trace import ALIBABA_ENV, alibaba_trace
from gen_trace import TraceSpec, write_trace
from machine import speed_line

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's code, not whichever one is installed

from hai_airflow.cli.sim import sim  # noqa: E402
from hai_airflow.scheduling import POLICIES  # noqa: E402
from hai_airflow.sim import load_trace, simulate, summarize  # noqa: E402
from hai_airflow.sim.engine import SimRun  # noqa: E402
from hai_airflow.sim.metrics import SimSummary  # noqa: E402
from hai_airflow.sim.trace import Trace, TraceJob  # noqa: E402

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


FLOOD_JOBS = 2_000
"""The flood: this many low-priority 1-GPU jobs of FLOOD_SECONDS, all submitted at once by one user."""
FLOOD_SECONDS = 900.0
PROBE_AFTER = 3600.0
"""Another user's one low job of the same size comes this long after the flood (finding 6 of issue 56)."""


def with_flood(trace: Trace) -> Trace:
    """The trace plus `flood`'s FLOOD_JOBS low jobs at its median submit time and `probe`'s one after."""
    at = sorted(j.submit_time for j in trace.jobs)[len(trace.jobs) // 2]
    first = max(j.id for j in trace.jobs) + 1
    like = TraceJob(first, at, FLOOD_SECONDS, 1, 1, None, 0, "flood", "flood")
    added = [replace(like, id=first + i) for i in range(FLOOD_JOBS)]
    probe = replace(like, id=first + FLOOD_JOBS, submit_time=at + PROBE_AFTER, user="probe", group="probe")
    added.append(probe)
    jobs = sorted((*trace.jobs, *added), key=lambda j: (j.submit_time, j.id))
    return Trace(trace.nodes, tuple(jobs), trace.quota)


def _hm(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _probe_wait(run: SimRun) -> str:
    waits = [o.first_started_at - o.job.submit_time for o in run.outcomes
             if o.job.user == "probe" and o.first_started_at is not None]
    return _hm(waits[0]) if waits else "-"


def fairness(label: str, trace: Trace) -> None:
    """Seed with the fair-share term off and on: high-priority promises, and the users' low waits."""
    print(f"\nfair share, {label}: {len(trace.jobs)} jobs, policy seed")
    print("| fair share | high within max_schedule | high queue p95 | low queue p50 / p95 | users' median "
          "low wait, least / most | Jain's index of users' mean low wait | probe's wait |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for on in (False, True):
        began = time.perf_counter()
        run = simulate(trace, "seed", fair_share=on)
        s: SimSummary = summarize(run)
        within = f"{100 * s.high_within_max_schedule:.1f}%" if s.high_within_max_schedule is not None else "-"
        jain = f"{s.low_user_mean_jain:.3f}" if s.low_user_mean_jain is not None else "-"
        print(f"| {'on' if on else 'off'} | {within} | {_hm(s.high_queue_p95_s)} | "
              f"{_hm(s.low_queue_p50_s)} / {_hm(s.low_queue_p95_s)} | "
              f"{_hm(s.low_user_median_min_s)} / {_hm(s.low_user_median_max_s)} | {jain} | "
              f"{_probe_wait(run)} |  ({time.perf_counter() - began:.0f} s)")


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
    parser.add_argument("--fairness", action=argparse.BooleanOptionalAction, default=True,
                        help="the fair-share term on and off (--no-fairness skips it)")
    parser.add_argument("--alibaba", type=Path,
                        help=f"openb_pod_list_default.csv, or a clone or git mirror of alibaba/clusterdata "
                             f"(default: ${ALIBABA_ENV}); without it the Alibaba rows are skipped")
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
        if args.fairness:
            fairness(f"synthetic trace (seed {args.seed}, load {args.load})", trace)
            found = alibaba_trace(args.alibaba, Path(scratch))
            if found is not None:
                label, nodes, jobs = found
                alibaba = load_trace(nodes, jobs, None)
                fairness(label, alibaba)
                flood = (f"{label} + one user's {FLOOD_JOBS:,} low jobs of {FLOOD_SECONDS:g} s at its median "
                         f"submit time, another's one {PROBE_AFTER:g} s later (the probe)")
                fairness(flood, with_flood(alibaba))


if __name__ == "__main__":
    main()
