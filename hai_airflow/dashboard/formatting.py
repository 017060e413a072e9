"""How numbers, times, durations and job colours read on the dashboard."""

from __future__ import annotations

from datetime import UTC, datetime

from hai_airflow.spec import JobShapeView

GOLDEN_ANGLE = 137.508
"""Successive job ids get hues this far apart, so neighbours on the GPU grid never look alike."""


def job_colour(job_id: int) -> str:
    """A stable fill colour for a job, the same on every page."""
    hue = (job_id * GOLDEN_ANGLE) % 360
    return f"hsl({hue:.0f}, 62%, 58%)"


def number(value: float) -> str:
    """Thousands separators, no decimals past the second: weights are seconds or 1e9 offsets."""
    if abs(value) >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:,.1f}"


def duration(seconds: float) -> str:
    """`42s`, `3m 05s`, `2h 10m`, `3d 4h`: coarse enough to read at a glance."""
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def clock(at: datetime | None) -> str:
    """UTC wall-clock time; every page says its times are UTC."""
    if at is None:
        return "—"
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def gpu_ranges(indices: list[int] | tuple[int, ...]) -> str:
    """Contiguous GPU blocks: (0, 1, 2, 3, 6) -> `0–3, 6`."""
    runs: list[tuple[int, int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in runs)


def workers(job: JobShapeView) -> str:
    """A distributed job's workers: `4 workers`, a resizable one's least `4 workers (min 2)`, a shrunk
    one's current of asked `2/4 workers (min 2)`; empty for a job of one worker that never resizes."""
    if job.workers <= 1 and job.min_workers is None:
        return ""
    count = f"{job.size}/{job.workers}" if job.resized else str(job.workers)
    least = f" (min {job.min_workers})" if job.min_workers is not None else ""
    return f"{count} workers{least}"
