"""How accurate start forecasts are: `hai sim --forecast` on the synthetic benchmark trace and on Alibaba's
production GPU trace, printed as the table docs/simulator.md publishes (median and range of the runs)."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from alibaba_trace import ALIBABA_ENV, alibaba_trace
from gen_trace import TraceSpec, write_trace
from machine import speed_line

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's code, not whichever one is installed

from hai_airflow.cli.output import duration  # noqa: E402
from hai_airflow.sim import Trace, load_trace  # noqa: E402
from hai_airflow.sim.accuracy import ForecastAccuracy, accuracy_table  # noqa: E402
from hai_airflow.sim.sampler import (  # noqa: E402
    DEFAULT_EVERY_SECONDS,
    DEFAULT_TIME_LIMIT_SECONDS,
    replay_with_forecasts,
)

"""Where the Alibaba pod list is when --alibaba is not given: the CSV, or a clone or mirror of the repo."""
FIGURES: tuple[tuple[str, Callable[[ForecastAccuracy], float | None], Callable[[float], str]], ...] = (
    ("median abs. error", lambda a: a.median_abs_error_s, duration),
    ("within ±25% of the wait", lambda a: a.within_25pct, lambda v: f"{v:.0%}"),
    ("waits < 1 h within ±10 min", lambda a: a.short_within_10min, lambda v: f"{v:.0%}"),
    ("started later than forecast", lambda a: a.started_later, lambda v: f"{v:.0%}"),
)


def _cell(values: Sequence[float | None], show: Callable[[float], str]) -> str:
    """One figure over the runs: its median, and its range where the runs differ; `—` where undefined."""
    known = sorted(v for v in values if v is not None)
    if not known:
        return "—"
    middle = show(statistics.median(known))
    return middle if known[0] == known[-1] else f"{middle} ({show(known[0])}–{show(known[-1])})"


def print_table(runs: Sequence[list[ForecastAccuracy]]) -> None:
    """The table in Markdown: one line per class and method, the figures' median (range) over the runs."""
    print("| class | method | forecasts | " + " | ".join(name for name, _, _ in FIGURES) + " |")
    print("|---|---|---:|" + "---:|" * len(FIGURES))
    for i, row in enumerate(runs[0]):
        cells = [_cell([get(run[i]) for run in runs], show) for _, get, show in FIGURES]
        if row.method == "unknown":
            cells[0] = "—"
        print(f"| {row.priority} | {row.method} | {row.forecasts:,} | " + " | ".join(cells) + " |")


def measure(name: str, trace: Trace, policy: str, runs: int) -> None:
    print(f"\n{name}: {len(trace.jobs):,} jobs, {len(trace.nodes):,} nodes, "
          f"{sum(n.gpus for n in trace.nodes):,} GPUs; policy {policy}", flush=True)
    tables, walls, forward = [], [], []
    for _ in range(runs):
        began = time.perf_counter()
        result = replay_with_forecasts(trace, policy)
        walls.append(time.perf_counter() - began)
        forward.append(result.forward_seconds)
        tables.append(accuracy_table(result.forecasts))
        incomplete = f", {result.incomplete} stopped by their budget" if result.incomplete else ""
        print(f"  run: {walls[-1]:.1f} s wall, {result.forward_runs} forward runs taking {forward[-1]:.1f} s"
              f"{incomplete}", flush=True)
    same = all(t == tables[0] for t in tables)
    print(f"  {runs} runs: {statistics.median(walls):.1f} s wall ({min(walls):.1f}–{max(walls):.1f}); "
          + ("the figures are the same in every run (deterministic)" if same
             else "the figures: median (range) of the runs"))
    print()
    print_table(tables)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--policy", default="seed")
    parser.add_argument("--jobs", type=int, default=TraceSpec.jobs, help="synthetic trace: jobs")
    parser.add_argument("--nodes", type=int, default=TraceSpec.nodes, help="synthetic trace: 8-GPU nodes")
    parser.add_argument("--alibaba", type=Path,
                        help=f"openb_pod_list_default.csv, or a clone or git mirror of alibaba/clusterdata "
                             f"(default: ${ALIBABA_ENV})")
    parser.add_argument("--skip-synthetic", action="store_true")
    args = parser.parse_args(argv)
    print(speed_line())
    print(f"a forecast of the queue every {duration(DEFAULT_EVERY_SECONDS)} of simulated time; the "
          f"slurm-style baseline gives a job without a time limit {duration(DEFAULT_TIME_LIMIT_SECONDS)}")
    with tempfile.TemporaryDirectory(prefix="hai-forecast-accuracy-") as scratch:
        if not args.skip_synthetic:
            spec = TraceSpec(jobs=args.jobs, nodes=args.nodes)
            paths = write_trace(spec, Path(scratch) / "synthetic")
            label = f"synthetic (gen_trace.py seed {spec.seed}, load {spec.load})"
            measure(label, load_trace(*paths), args.policy, args.runs)
        found = alibaba_trace(args.alibaba, Path(scratch))
        if found is not None:
            label, nodes, jobs = found
            measure(label, load_trace(nodes, jobs), args.policy, args.runs)


if __name__ == "__main__":
    main()
