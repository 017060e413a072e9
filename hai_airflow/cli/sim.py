"""`hai sim`: replay a job trace through the scheduler on a virtual clock and report the figures."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from hai_airflow.cli.output import NONE, PIPE_WIDTH, Column, duration, emit, fail, usage_error
from hai_airflow.scheduling import POLICIES
from hai_airflow.sim import (
    DEFAULT_CHECKPOINT_INTERVAL,
    SimSummary,
    SimulationError,
    TraceError,
    load_trace,
    simulate,
    summarize,
)


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
    Column("suspensions", lambda s: s.suspensions, "right"),
    Column("lost GPU-hours", lambda s: f"{s.lost_gpu_hours:.2f}", "right"),
    Column("planner cycles", lambda s: s.planner_cycles, "right"),
    Column("planner time/cycle median", lambda s: _ms(s.planner_ms_median), "right"),
    Column("planner time/cycle max", lambda s: _ms(s.planner_ms_max), "right"),
    Column("wall time", lambda s: f"{s.wall_s:.2f} s", "right"),
    Column("simulated jobs/wall-s", lambda s: f"{s.jobs_per_wall_s:,.0f}", "right"),
)


def _side_by_side(summaries: Sequence[SimSummary]) -> None:
    """One column per policy, so figures of the same trace line up for comparison."""
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("figure", style="bold")
    for summary in summaries:
        table.add_column(summary.policy, justify="right")
    for column in COLUMNS[1:]:
        cells = (column.cell(s) for s in summaries)
        table.add_row(column.header, *(Text(NONE if c is None else str(c)) for c in cells))
    width = None if sys.stdout.isatty() else PIPE_WIDTH
    Console(file=sys.stdout, width=width, highlight=False, emoji=False).print(table)


def _policies(policy: str, compare: str | None) -> list[str]:
    names = [p.strip() for p in compare.split(",") if p.strip()] if compare is not None else [policy]
    known = ", ".join(POLICIES)
    if not names:
        usage_error(f"--compare names no policy. Give a comma-separated list of: {known}")
    for name in names:
        if name not in POLICIES:
            usage_error(f"unknown policy {name!r}. Choose from: {known}")
    return list(dict.fromkeys(names))


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
            "group,user,cpus,memory_gb and optionally elastic. Seconds; max_schedule hours (0 = low "
            "priority); empty gpu_type = any; cpus/memory_gb per worker.",
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
            "--suspend-delay", min=0, help="Seconds a suspended job keeps its GPUs before they are free."
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
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print JSON keyed by figure name instead of a table (for programs)."),
    ] = False,
) -> None:
    """Replay a job trace through the scheduler on a virtual clock and report what happened."""
    names = _policies(policy, compare)
    try:
        trace = load_trace(nodes, jobs, config)
    except TraceError as error:
        usage_error(f"{error}. Fix the file and run again")
    summaries: list[SimSummary] = []
    for name in names:
        try:
            run = simulate(trace, name, checkpoint_interval, suspend_delay, cycle_interval)
        except SimulationError as error:
            fail(f"the simulation under policy {name!r} stopped: {error}. Report this as a planner bug", 1)
        summaries.append(summarize(run))
    if compare is None:
        emit(summaries[0], COLUMNS, as_json=as_json, title=f"hai sim: {len(trace.jobs)} jobs")
    elif as_json:
        emit(summaries, COLUMNS, as_json=True)
    else:
        _side_by_side(summaries)
