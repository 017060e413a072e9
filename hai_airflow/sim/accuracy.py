"""How close start forecasts came to the real starts: the error figures, per priority class and method."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from hai_airflow.sim.metrics import figure, percentile

Method = Literal["forecast", "slurm-style", "unknown"]
METHODS: tuple[Method, ...] = ("forecast", "slurm-style", "unknown")
PriorityClass = Literal["high", "low"]
CLASSES: tuple[PriorityClass, ...] = ("high", "low")
WITHIN_SHARE = 0.25
"""A forecast is close when its error is at most this share of the wait it predicted."""
SHORT_WAIT_SECONDS = 3600.0
"""Waits shorter than this are judged in minutes instead (a quarter of a short wait is too strict)."""
SHORT_WITHIN_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class StartForecast:
    """One forecast of a queued job's first start, made at `made_at`, and when it really started.

    `predicted` None: the method gave no start (an unknown estimate, or none within its horizon).
    """

    job_id: int
    high: bool
    made_at: float
    predicted: float | None
    started_at: float

    @property
    def wait(self) -> float:
        """The wait the forecast was about: from when it was made to the real start."""
        return self.started_at - self.made_at


def abs_error(f: StartForecast) -> float | None:
    """Seconds between the predicted and the real start; None where nothing was predicted."""
    return None if f.predicted is None else abs(f.predicted - f.started_at)


def is_close(f: StartForecast) -> bool:
    """Within WITHIN_SHARE of the wait; a missing prediction is never close."""
    error = abs_error(f)
    return error is not None and error <= WITHIN_SHARE * f.wait


def is_short(f: StartForecast) -> bool:
    return f.wait < SHORT_WAIT_SECONDS


def is_close_in_minutes(f: StartForecast) -> bool:
    """Within SHORT_WITHIN_SECONDS of the real start; a missing prediction is never close."""
    error = abs_error(f)
    return error is not None and error <= SHORT_WITHIN_SECONDS


def share(flags: Iterable[bool]) -> float | None:
    """The share of true flags; None when there are none at all."""
    values = list(flags)
    return sum(values) / len(values) if values else None


def median_abs_error(forecasts: Sequence[StartForecast]) -> float | None:
    """The median error over the forecasts that predicted a start; None where none did."""
    errors = sorted(e for e in map(abs_error, forecasts) if e is not None)
    return percentile(errors, 50)


class ForecastAccuracy(BaseModel):
    """One line of `hai sim --forecast`: how one method forecast the starts of one priority class."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    priority: PriorityClass = figure("Priority class the jobs ran as.")
    method: Method = figure(
        "forecast: the planner run forward with runtime estimates; slurm-style: the same run with every "
        "job at its time limit; unknown: no estimate at all, what a low job shows without a forecast."
    )
    forecasts: int = figure("Forecasts of queued jobs' first starts, each measured at the real start.")
    predicted: float | None = figure("Share of forecasts that gave a start at all.")
    median_abs_error_s: float | None = figure("Median seconds between predicted and real start.")
    within_25pct: float | None = figure("Share of forecasts within 25% of the wait they predicted.")
    short_waits: int = figure("Forecasts made less than an hour before the real start.")
    short_within_10min: float | None = figure("Of those, the share within 10 minutes of the real start.")
    started_later: float | None = figure(
        "Of the forecasts that gave a start, the share whose job started later than predicted (jobs "
        "submitted after the forecast, unknown to it, can overtake a queued job)."
    )


def accuracy(priority: PriorityClass, method: Method, forecasts: Sequence[StartForecast]) -> ForecastAccuracy:
    """The figures of one method over one class's forecasts; a missing prediction counts as a miss."""
    short = [f for f in forecasts if is_short(f)]
    return ForecastAccuracy(
        priority=priority,
        method=method,
        forecasts=len(forecasts),
        predicted=share(f.predicted is not None for f in forecasts),
        median_abs_error_s=median_abs_error(forecasts),
        within_25pct=share(map(is_close, forecasts)),
        short_waits=len(short),
        short_within_10min=share(map(is_close_in_minutes, short)),
        started_later=share(f.started_at > f.predicted for f in forecasts if f.predicted is not None),
    )


def accuracy_table(by_method: Mapping[Method, Sequence[StartForecast]]) -> list[ForecastAccuracy]:
    """Per class (high, then low), one line per method in METHODS order."""
    rows: list[ForecastAccuracy] = []
    for priority in CLASSES:
        for method in METHODS:
            if method in by_method:
                of_class = [f for f in by_method[method] if f.high == (priority == "high")]
                rows.append(accuracy(priority, method, of_class))
    return rows
