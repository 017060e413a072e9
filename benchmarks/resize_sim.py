"""What resizable jobs change: `hai sim` under every policy with none and a share of the multi-worker jobs
resizable (`--resizable-share`), on the synthetic benchmark trace and on Alibaba's production GPU trace,
printed as the table docs/simulator.md publishes."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from alibaba_trace import ALIBABA_ENV, alibaba_trace
from gen_trace import TraceSpec, write_trace
from machine import speed_line

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's code, not whichever one is installed

from hai_airflow.cli.output import duration  # noqa: E402
from hai_airflow.scheduling import POLICIES  # noqa: E402
from hai_airflow.sim import (  # noqa: E402
    DEFAULT_CHECKPOINT_INTERVAL,
    SimSummary,
    Trace,
    load_trace,
    simulate,
    summarize,
    with_resizable_share,
)

RESTART_DELAY_S = 60.0
"""Seconds from a resize's (or a suspension's) notice until the job's GPUs are free and it restarts."""
CYCLE_INTERVAL_S = 60.0
"""Plan every simulated minute rather than at every event: 8 replays of 10,000 jobs take minutes, not an
hour."""


def _time(seconds: float | None) -> str:
    return "—" if seconds is None else duration(seconds)


def row(summary: SimSummary, share: float) -> str:
    """One Markdown line: the figures resizing moves, for one policy and share."""
    cells = (
        summary.policy, f"{share:g}", f"{summary.lost_gpu_hours:,.0f}", f"{summary.gpu_utilisation:.1%}",
        _time(summary.low_jct_p50_s), _time(summary.low_jct_p90_s), f"{summary.suspensions:,}",
        f"{summary.shrinks:,}", f"{summary.grows:,}", _time(summary.high_queue_p95_s),
        f"{summary.jobs_finished:,}",
    )
    return "| " + " | ".join(cells) + " |"


HEADER = ("| policy | resizable share | lost GPU-hours | GPU utilisation | low completion p50 | "
          "low completion p90 | suspensions | shrinks | grows | high queue p95 | finished |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def measure(name: str, trace: Trace, policies: Sequence[str], shares: Sequence[float], seed: int,
            delay: float, cycle_interval: float) -> None:
    """Replay the trace under each policy and share; print the table."""
    distributed = sum(1 for j in trace.jobs if j.workers > 1 and j.gpus_per_worker > 0)
    print(f"\n{name}: {len(trace.jobs):,} jobs ({distributed:,} of several GPU workers), "
          f"{len(trace.nodes):,} nodes, {sum(n.gpus for n in trace.nodes):,} GPUs", flush=True)
    if not distributed:
        print("  no job has several workers, so --resizable-share has nothing to mark: every share "
              "replays as share 0 (shown to confirm it)")
    lines = []
    for policy in policies:
        for share in shares:
            began = time.perf_counter()
            summary = summarize(simulate(with_resizable_share(trace, share, seed), policy,
                                         suspend_delay=delay, cycle_interval=cycle_interval))
            print(f"  {policy}, share {share:g}: {time.perf_counter() - began:.1f} s", flush=True)
            lines.append(row(summary, share))
    print()
    print(HEADER)
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--shares", default="0,0.5", help="comma-separated --resizable-share values")
    parser.add_argument("--seed", type=int, default=1, help="--resizable-seed: which jobs a share marks")
    parser.add_argument("--restart-delay", type=float, default=RESTART_DELAY_S,
                        help="--suspend-delay: seconds a resized or suspended job holds its GPUs")
    parser.add_argument("--cycle-interval", type=float, default=CYCLE_INTERVAL_S, help="0 = exact")
    parser.add_argument("--jobs", type=int, default=TraceSpec.jobs, help="synthetic trace: jobs")
    parser.add_argument("--nodes", type=int, default=TraceSpec.nodes, help="synthetic trace: 8-GPU nodes")
    parser.add_argument("--load", type=float, default=TraceSpec.load, help="synthetic trace: offered load")
    parser.add_argument("--alibaba", type=Path,
                        help=f"openb_pod_list_default.csv, or a clone or git mirror of alibaba/clusterdata "
                             f"(default: ${ALIBABA_ENV})")
    parser.add_argument("--skip-synthetic", action="store_true")
    args = parser.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    shares = [float(s) for s in args.shares.split(",") if s]
    options = {"seed": args.seed, "delay": args.restart_delay, "cycle_interval": args.cycle_interval}
    print(speed_line())
    checkpoints = duration(DEFAULT_CHECKPOINT_INTERVAL)
    print(f"restart delay {args.restart_delay:g} s, a checkpoint every {checkpoints} of a run, a planner "
          f"cycle every {args.cycle_interval:g} s (0 = every event), resizable jobs picked with seed "
          f"{args.seed}")
    with tempfile.TemporaryDirectory(prefix="hai-resize-sim-") as scratch:
        if not args.skip_synthetic:
            spec = TraceSpec(jobs=args.jobs, nodes=args.nodes, load=args.load)
            paths = write_trace(spec, Path(scratch) / "synthetic")
            label = f"synthetic (gen_trace.py seed {spec.seed}, load {spec.load:g})"
            measure(label, load_trace(*paths), policies, shares, **options)
        found = alibaba_trace(args.alibaba, Path(scratch))
        if found is not None:
            label, nodes, jobs = found
            measure(label, load_trace(nodes, jobs), policies, shares, **options)


if __name__ == "__main__":
    main()
