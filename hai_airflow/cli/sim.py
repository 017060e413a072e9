"""`hai sim`: replay a job trace through the scheduler on a virtual clock and report the figures."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hai_airflow.cli.flags import with_flags
from hai_airflow.cli.output import (
    NONE,
    Column,
    Grid,
    OutputFlags,
    duration,
    emit,
    fail,
    print_grids,
    stdout_is_terminal,
    usage_error,
)
from hai_airflow.scheduling import POLICIES
from hai_airflow.sim import (
    DEFAULT_CHECKPOINT_INTERVAL,
    SimSummary,
    SimulationError,
    Trace,
    TraceError,
    load_trace,
    simulate,
    summarize,
    with_resizable_share,
)
from hai_airflow.sim.accuracy import ForecastAccuracy, accuracy_table
from hai_airflow.sim.sampler import DEFAULT_EVERY_SECONDS, DEFAULT_TIME_LIMIT_SECONDS, replay_with_forecasts


def _seconds(value: float | None) -> str | None:
    return None if value is None else duration(value)


def _share(value: float | None) -> str | None:
    return None if value is None else f"{value:.1%}"


def _ms(value: float | None) -> str | None:
    return None if value is None else f"{value:.2f} ms"


COLUMNS: tuple[Column, ...] = (
    Column("policy", lambda s: s.policy),
    Column("jobs", lambda s: s.jobs, "right"),
    Column("finished", lambda s: s.jobs_finished, "right"),
    Column("unfinished", lambda s: s.jobs_unfinished, "right"),
    Column("rejected", lambda s: s.jobs_rejected, "right"),
    Column("downgraded to low (quota)", lambda s: s.downgraded_to_low, "right"),
    Column("high-priority jobs", lambda s: s.high_jobs, "right"),
    Column("makespan", lambda s: _seconds(s.makespan_s), "right"),
    Column("GPU utilisation", lambda s: _share(s.gpu_utilisation), "right"),
    Column("high queue p50", lambda s: _seconds(s.high_queue_p50_s), "right"),
    Column("high queue p95", lambda s: _seconds(s.high_queue_p95_s), "right"),
    Column("high queue p99", lambda s: _seconds(s.high_queue_p99_s), "right"),
    Column("high started within max_schedule", lambda s: _share(s.high_within_max_schedule), "right"),
    Column("low queue p50", lambda s: _seconds(s.low_queue_p50_s), "right"),
    Column("low queue p95", lambda s: _seconds(s.low_queue_p95_s), "right"),
    Column("completion time p50", lambda s: _seconds(s.jct_p50_s), "right"),
    Column("completion time p95", lambda s: _seconds(s.jct_p95_s), "right"),
    Column("low completion time p50", lambda s: _seconds(s.low_jct_p50_s), "right"),
    Column("low completion time p90", lambda s: _seconds(s.low_jct_p90_s), "right"),
    Column("suspensions", lambda s: s.suspensions, "right"),
    Column("shrinks", lambda s: s.shrinks, "right"),
    Column("grows", lambda s: s.grows, "right"),
    Column("lost GPU-hours", lambda s: f"{s.lost_gpu_hours:.2f}", "right"),
    Column("planner cycles", lambda s: s.planner_cycles, "right"),
    Column("planner time/cycle median", lambda s: _ms(s.planner_ms_median), "right"),
    Column("planner time/cycle max", lambda s: _ms(s.planner_ms_max), "right"),
    Column("wall time", lambda s: f"{s.wall_s:.2f} s", "right"),
    Column("simulated jobs/wall-s", lambda s: f"{s.jobs_per_wall_s:,.0f}", "right"),
)


ACCURACY_COLUMNS: tuple[Column, ...] = (
    Column("priority", lambda a: a.priority),
    Column("method", lambda a: a.method),
    Column("forecasts", lambda a: a.forecasts, "right"),
    Column("gave a start", lambda a: _share(a.predicted), "right"),
    Column("median |error|", lambda a: _seconds(a.median_abs_error_s), "right"),
    Column("within ±25% of wait", lambda a: _share(a.within_25pct), "right"),
    Column("waits < 1h", lambda a: a.short_waits, "right"),
    Column("of those within ±10 min", lambda a: _share(a.short_within_10min), "right"),
    Column("started later than forecast", lambda a: _share(a.started_later), "right"),
)


def _side_by_side(summaries: Sequence[SimSummary], headers: bool) -> None:
    """One column per policy, so figures of the same trace line up for comparison."""
    rows = tuple(
        ((column.header, None), *((NONE if c is None else str(c), None) for c in map(column.cell, summaries)))
        for column in COLUMNS[1:]
    )
    grid = Grid(
        title=None,
        headers=("figure", *(s.policy for s in summaries)) if headers else None,
        justify=("left", *("right" for _ in summaries)),
        rows=rows,
    )
    print_grids([grid])


PROGRESS_EVERY = 0.1
"""Seconds of wall time between progress bar updates, so drawing never slows the replay."""

Progress_ = Callable[[float, int], None]
"""Reports the simulated time and the jobs finished of one replay."""


@contextmanager
def progress_bars(policies: Sequence[str], jobs: int, out: OutputFlags) -> Iterator[dict[str, Progress_]]:
    """One bar per policy (jobs finished, simulated time reached) on a terminal; none piped or for data."""
    if out.is_data or not (stdout_is_terminal() and sys.stderr.isatty()):
        yield {}
        return
    bars = Progress(
        TextColumn("{task.description:<16}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs finished, simulated {task.fields[simulated]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with bars:
        updates: dict[str, Progress_] = {}
        for policy in policies:
            task = bars.add_task(policy, total=jobs, simulated=duration(0))
            last = [0.0]

            def update(now: float, finished: int, task: object = task, last: list[float] = last) -> None:
                if time.monotonic() - last[0] >= PROGRESS_EVERY or finished == jobs:
                    last[0] = time.monotonic()
                    bars.update(task, completed=finished, simulated=duration(now))  # type: ignore[arg-type]

            updates[policy] = update
        yield updates


def _policies(policy: str, compare: str | None) -> list[str]:
    names = [p.strip() for p in compare.split(",") if p.strip()] if compare is not None else [policy]
    known = ", ".join(POLICIES)
    if not names:
        usage_error(f"--compare names no policy. Give a comma-separated list of: {known}")
    for name in names:
        if name not in POLICIES:
            usage_error(f"unknown policy {name!r}. Choose from: {known}")
    return list(dict.fromkeys(names))


@with_flags()
def sim(
    nodes: Annotated[
        Path,
        typer.Option(
            "--nodes", help="CSV of machines: name,gpu_type,gpus,cpus,memory_gb.", show_default=False
        ),
    ],
    jobs: Annotated[
        Path,
        typer.Option(
            "--jobs",
            help="CSV of jobs: job_id,submit_time,duration,workers,gpus_per_worker,gpu_type,max_schedule,"
            "group,user,cpus,memory_gb and optionally elastic and min_workers (a resizable job's least "
            "workers). Seconds; max_schedule hours (0 = low priority); empty gpu_type = any; "
            "cpus/memory_gb per worker.",
            show_default=False,
        ),
    ],
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="quotas.toml: arrays of tables `groups` (name, quota_gpus) and `users` (name, group, "
            "quota_gpus); no file = no quota limits.",
            show_default=False,
        ),
    ] = None,
    policy: Annotated[
        str, typer.Option("--policy", help="Planner policy: " + ", ".join(POLICIES) + ".")
    ] = "seed",
    checkpoint_interval: Annotated[
        float,
        typer.Option(
            "--checkpoint-interval",
            min=0,
            help="Seconds of runtime between a job's checkpoints; a suspended job loses the work since "
            "its last one (elastic jobs lose nothing). 0 = jobs never checkpoint.",
        ),
    ] = DEFAULT_CHECKPOINT_INTERVAL,
    suspend_delay: Annotated[
        float,
        typer.Option(
            "--suspend-delay",
            min=0,
            help="Seconds a suspended or resized job keeps its GPUs before they are free (a resized one "
            "then restarts at its new size, and those seconds count as lost).",
        ),
    ] = 0.0,
    cycle_interval: Annotated[
        float,
        typer.Option(
            "--cycle-interval",
            min=0,
            help="Seconds between planner cycles, like a controller on a timer; 0 = plan at every event "
            "time (exact). A few seconds to a minute makes long traces much faster to replay.",
        ),
    ] = 0.0,
    resizable_share: Annotated[
        float,
        typer.Option(
            "--resizable-share",
            min=0,
            max=1,
            help="Make this share (0..1) of the multi-worker GPU jobs resizable down to half their "
            "workers (min_workers), picked by --resizable-seed; the other jobs keep the file's "
            "min_workers. A resize restarts the job at its new size after --suspend-delay.",
        ),
    ] = 0.0,
    resizable_seed: Annotated[
        int, typer.Option("--resizable-seed", help="Seed of the jobs --resizable-share picks.")
    ] = 1,
    forecast: Annotated[
        bool,
        typer.Option(
            "--forecast",
            help="Measure start forecasts instead: every --forecast-every simulated seconds, forecast "
            "each queued job's first start as the server does, beside the slurm-style baseline (every "
            "job runs to its time limit) and no estimate; report the errors per priority class. JOBS.csv "
            "may add columns time_limit (seconds) and task_name.",
        ),
    ] = False,
    forecast_every: Annotated[
        float,
        typer.Option("--forecast-every", min=1, help="Simulated seconds between forecasts of the queue."),
    ] = DEFAULT_EVERY_SECONDS,
    default_time_limit: Annotated[
        float,
        typer.Option(
            "--default-time-limit",
            min=1,
            help="Seconds the slurm-style baseline gives a job whose trace row has no time_limit.",
        ),
    ] = DEFAULT_TIME_LIMIT_SECONDS,
    compare: Annotated[
        str | None,
        typer.Option(
            "--compare",
            help="Comma-separated policies to run on the same trace side by side, e.g. "
            + ",".join(POLICIES)
            + ". Overrides --policy.",
            show_default=False,
        ),
    ] = None,
    out: OutputFlags = OutputFlags(),
) -> None:
    """Replay a job trace through the scheduler on a virtual clock and report what happened."""
    names = _policies(policy, compare)
    if forecast and compare is not None:
        usage_error("--forecast measures one policy. Drop --compare, or give --policy")
    try:
        trace = load_trace(nodes, jobs, config)
    except TraceError as error:
        usage_error(f"{error}. Fix the file and run again")
    trace = with_resizable_share(trace, resizable_share, resizable_seed)
    if forecast:
        options = {"checkpoint_interval": checkpoint_interval, "suspend_delay": suspend_delay,
                   "cycle_interval": cycle_interval, "every": forecast_every,
                   "default_limit": default_time_limit}
        _forecast_accuracy(trace, names[0], options, out)
        return
    summaries: list[SimSummary] = []
    with progress_bars(names, len(trace.jobs), out) as bars:
        for name in names:
            try:
                run = simulate(
                    trace, name, checkpoint_interval, suspend_delay, cycle_interval, bars.get(name)
                )
            except SimulationError as error:
                fail(
                    f"the simulation under policy {name!r} stopped: {error}. Report this as a planner bug", 1
                )
            summaries.append(summarize(run))
    if compare is None:
        title = f"hai sim: {len(trace.jobs)} jobs"
        emit(summaries[0], COLUMNS, out=out, title=title, name=lambda s: s.policy)
    elif out.format not in ("table", "wide"):
        emit(summaries, COLUMNS, out=out, name=lambda s: s.policy)
    else:
        _side_by_side(summaries, headers=not out.no_headers)


def _forecast_accuracy(trace: Trace, policy: str, options: dict[str, float], out: OutputFlags) -> None:
    """Replay with forecasts and print the accuracy table (one line per class and method)."""
    with progress_bars([policy], len(trace.jobs), out) as bars:
        try:
            measured = replay_with_forecasts(
                trace, policy, options["every"], options["default_limit"],
                checkpoint_interval=options["checkpoint_interval"], suspend_delay=options["suspend_delay"],
                cycle_interval=options["cycle_interval"], progress=bars.get(policy),
            )
        except SimulationError as error:
            fail(f"the simulation under policy {policy!r} stopped: {error}. Report this as a planner bug", 1)
    rows: list[ForecastAccuracy] = accuracy_table(measured.forecasts)
    title = (f"hai sim --forecast: {len(trace.jobs)} jobs, policy {policy}, a forecast every "
             f"{duration(options['every'])}; slurm-style limit where none given: "
             f"{duration(options['default_limit'])}")
    emit(rows, ACCURACY_COLUMNS, out=out, title=title, name=lambda a: f"{a.priority}/{a.method}")
    if measured.incomplete and not out.is_data:
        print(f"note: {measured.incomplete} of {measured.forward_runs} forward runs ran out of their time "
              "budget; their jobs count as given no start", file=sys.stderr)
