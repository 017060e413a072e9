"""Trace-driven simulator: replays a job trace through the platform's planner on a virtual clock."""

from hai_airflow.sim.engine import DEFAULT_CHECKPOINT_INTERVAL, JobOutcome, SimRun, SimulationError, simulate
from hai_airflow.sim.metrics import SimSummary, percentile, summarize
from hai_airflow.sim.trace import (
    Trace,
    TraceError,
    TraceJob,
    load_jobs,
    load_nodes,
    load_quota,
    load_trace,
    with_resizable_share,
)

__all__ = [
    "DEFAULT_CHECKPOINT_INTERVAL",
    "JobOutcome",
    "SimRun",
    "SimSummary",
    "SimulationError",
    "Trace",
    "TraceError",
    "TraceJob",
    "load_jobs",
    "load_nodes",
    "load_quota",
    "load_trace",
    "percentile",
    "simulate",
    "summarize",
    "with_resizable_share",
]
