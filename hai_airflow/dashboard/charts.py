"""Geometry for the Usage page's inline SVG charts: GPU-hours per day stacked by user or group,
the cluster's utilisation per day, and the tasks waiting to start hour by hour (no drawing here)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from hai_airflow.spec import UsageHistoryView

WIDTH = 900
HEIGHT = 200
LEFT = 56
"""Room for the y axis' labels."""
BOTTOM = 22
"""Room for the x axis' labels."""
TOP = 8
PALETTE = ("#2f5bd3", "#e08a2c", "#3aa66a", "#9b59b6", "#d64545", "#17a2b8", "#8d6e63", "#c2185b")
Y_TICKS = 4


@dataclass(frozen=True)
class Box:
    """One rectangle of a bar chart, with what it stands for."""

    x: float
    y: float
    width: float
    height: float
    colour: str
    title: str


@dataclass(frozen=True)
class Label:
    x: float
    y: float
    text: str


@dataclass(frozen=True)
class Chart:
    """A chart's shapes in SVG coordinates: bars (`boxes`) or a line (`points`), axis labels, legend."""

    boxes: tuple[Box, ...] = ()
    points: str = ""
    y_labels: tuple[Label, ...] = ()
    x_labels: tuple[Label, ...] = ()
    legend: tuple[tuple[str, str], ...] = ()
    width: int = WIDTH
    height: int = HEIGHT

    @property
    def baseline(self) -> float:
        return self.height - BOTTOM


def nice_top(value: float) -> float:
    """A round upper bound for an axis: 1, 2 or 5 times a power of ten, at least `value`."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value)


def _y_labels(top: float, unit: str) -> tuple[Label, ...]:
    plot = HEIGHT - BOTTOM - TOP
    return tuple(
        Label(LEFT - 6, HEIGHT - BOTTOM - plot * i / Y_TICKS + 4, f"{top * i / Y_TICKS:g}{unit}")
        for i in range(Y_TICKS + 1)
    )


def _day_labels(days: tuple[datetime, ...], slot: float) -> tuple[Label, ...]:
    every = max(1, math.ceil(len(days) / 10))
    return tuple(
        Label(LEFT + slot * (i + 0.5), HEIGHT - 6, d.strftime("%m-%d"))
        for i, d in enumerate(days)
        if i % every == 0
    )


def gpu_hours_by_day(history: UsageHistoryView) -> Chart:
    """Stacked bars: each day's GPU-hours, one colour per user or group."""
    n = max(len(history.days), 1)
    totals = [sum(s.gpu_hours[i] for s in history.series) for i in range(len(history.days))]
    top = nice_top(max(totals, default=0.0))
    slot, plot = (WIDTH - LEFT) / n, HEIGHT - BOTTOM - TOP
    colours = {s.name: PALETTE[i % len(PALETTE)] for i, s in enumerate(history.series)}
    boxes = []
    for i, day in enumerate(history.days):
        y = float(HEIGHT - BOTTOM)
        for s in history.series:
            height = plot * s.gpu_hours[i] / top
            if height <= 0:
                continue
            y -= height
            title = f"{s.name} on {day:%Y-%m-%d}: {s.gpu_hours[i]:,.1f} GPU-hours"
            boxes.append(Box(LEFT + slot * i + slot * 0.15, y, slot * 0.7, height, colours[s.name], title))
    return Chart(
        boxes=tuple(boxes),
        y_labels=_y_labels(top, ""),
        x_labels=_day_labels(history.days, slot),
        legend=tuple(colours.items()),
    )


def utilisation_by_day(history: UsageHistoryView) -> Chart:
    """Bars: each day's GPU-hours as a share of what the cluster's GPUs could give (24 h each)."""
    n = max(len(history.days), 1)
    slot, plot = (WIDTH - LEFT) / n, HEIGHT - BOTTOM - TOP
    capacity = history.cluster_gpus * 24
    boxes = []
    for i, day in enumerate(history.days):
        used = sum(s.gpu_hours[i] for s in history.series)
        share = min(used / capacity, 1.0) if capacity else 0.0
        height = plot * share
        title = f"{day:%Y-%m-%d}: {share:.0%} of {history.cluster_gpus} GPUs"
        boxes.append(
            Box(
                LEFT + slot * i + slot * 0.15, HEIGHT - BOTTOM - height, slot * 0.7, height, PALETTE[2], title
            )
        )
    return Chart(boxes=tuple(boxes), y_labels=_y_labels(100, "%"), x_labels=_day_labels(history.days, slot))


def waiting_by_hour(history: UsageHistoryView) -> Chart:
    """A line: the tasks waiting for their first start, hour by hour."""
    counts = history.waiting
    top = nice_top(max(counts, default=0))
    plot = HEIGHT - BOTTOM - TOP
    step = (WIDTH - LEFT) / max(len(counts) - 1, 1)
    points = " ".join(
        f"{LEFT + step * i:.1f},{HEIGHT - BOTTOM - plot * c / top:.1f}" for i, c in enumerate(counts)
    )
    first = history.until - timedelta(hours=max(len(counts) - 1, 0))
    every = max(1, math.ceil(len(history.days) / 10))
    midnights = [d for d in history.days if d >= first][::every]
    x_labels = tuple(
        Label(LEFT + step * (d - first).total_seconds() / 3600, HEIGHT - 6, d.strftime("%m-%d"))
        for d in midnights
    )
    return Chart(points=points, y_labels=_y_labels(top, ""), x_labels=x_labels)
