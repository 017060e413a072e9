"""Listings as plain text: columns, the space-aligned table, CSV, names, and the cell formatters
(times, ages, durations, placements). The full `hai` draws these when piped and the downloadable one
always. Standard library only, Python 3.8+; a record is anything with the API's fields as attributes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hai_airflow.vocabulary import JobState

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from datetime import datetime, timezone
    from typing import Any

NONE = "-"


@dataclass(frozen=True)
class Column:
    """A table column: its header, how a row renders in it, and whether only `-o wide` shows it."""

    header: str
    cell: Callable[[Any], object]
    justify: str = "left"
    wide: bool = False
    style: Callable[[Any], str | None] | None = None


@dataclass(frozen=True)
class Section:
    """A table printed below the main one for people; in JSON it is already nested in the data."""

    title: str
    rows: Sequence[Any]
    columns: Sequence[Column]


@dataclass(frozen=True)
class Grid:
    """A table before it is drawn: plain text cells, one style per cell (None = plain)."""

    title: str | None
    headers: tuple[str, ...] | None
    justify: tuple[str, ...]
    rows: tuple[tuple[tuple[str, str | None], ...], ...]
    record: bool = False


def cell_text(value: object) -> str:
    """A cell as shown: `-` for nothing, on one line (a newline inside a reason would break `grep`)."""
    return NONE if value is None or value == "" else " ".join(str(value).split())


def _cells(row: Any, columns: Sequence[Column]) -> tuple[tuple[str, str | None], ...]:
    return tuple((cell_text(c.cell(row)), c.style(row) if c.style else None) for c in columns)


def rows_grid(
    rows: Sequence[Any], columns: Sequence[Column], title: str | None, headers: bool = True
) -> Grid:
    """A listing: one row per record."""
    return Grid(
        title=title,
        headers=tuple(c.header for c in columns) if headers else None,
        justify=tuple(c.justify for c in columns),
        rows=tuple(_cells(row, columns) for row in rows),
    )


def record_grid(record: Any, columns: Sequence[Column], title: str | None) -> Grid:
    """One record: a `field value` line per column."""
    rows = tuple(((c.header, None), _cells(record, (c,))[0]) for c in columns)
    return Grid(title=title, headers=None, justify=("left", "left"), rows=rows, record=True)


def listing_grids(
    data: Any,
    one: bool,
    columns: Sequence[Column],
    wide: bool,
    headers: bool,
    title: str | None = None,
    sections: Sequence[Section] = (),
) -> list[Grid]:
    """The tables of one record (`one`) or a listing, then its sections; no table for an empty listing."""
    shown = [c for c in columns if wide or not c.wide]
    grids: list[Grid] = []
    if one:
        grids.append(record_grid(data, shown, title if headers else None))
    elif data:
        grids.append(rows_grid(data, shown, title if headers else None, headers))
    for s in sections:
        if s.rows:
            grids.append(rows_grid(s.rows, s.columns, s.title if headers else None, headers))
    return grids


def cell_len(text: str) -> int:
    """Terminal cells `text` takes: two for wide (CJK) characters, none for combining marks."""
    import unicodedata

    return sum(
        0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
        for ch in text
    )


def plain_table(grid: Grid) -> str:
    """Columns aligned with spaces (two between columns), no box characters, no colour, no trailing blanks."""
    lines = [list(grid.headers)] if grid.headers is not None else []
    lines += [[text for text, _ in row] for row in grid.rows]
    widths = [max((cell_len(line[i]) for line in lines), default=0) for i in range(len(grid.justify))]
    out = [grid.title] if grid.title else []
    for line in lines:
        cells = []
        for text, width, justify in zip(line, widths, grid.justify):  # noqa: B905 (3.8 has no strict)
            pad = " " * (width - cell_len(text))
            cells.append(pad + text if justify == "right" else text + pad)
        out.append("  ".join(cells).rstrip())
    return "".join(line + "\n" for line in out)


def plain_tables(grids: Sequence[Grid]) -> str:
    """Tables one after another, a blank line between them."""
    return "\n".join(plain_table(grid) for grid in grids)


def csv_text(rows: Sequence[Any], columns: Sequence[Column], headers: bool) -> str:
    """The rows as CSV, every column (the wide ones too), the cells as a table shows them."""
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if headers:
        writer.writerow(c.header for c in columns)
    for row in rows:
        writer.writerow(["" if c.cell(row) is None else cell_text(c.cell(row)) for c in columns])
    return buffer.getvalue()


def error_line(message: str) -> str:
    """`Error: what failed. How to fix it.` from a message that may lack the final stop."""
    text = message.strip()
    # A question or an exclamation already ends its sentence: no "?." or "!.".
    if not text.endswith((".", "?", "!")):
        text += "."
    return f"Error: {text}"


STATE_STYLES: dict[str, str] = {
    JobState.PENDING: "yellow",
    JobState.STARTING: "cyan",
    JobState.RUNNING: "green",
    JobState.SUSPENDING: "magenta",
    JobState.SUSPENDED: "magenta",
    JobState.SUCCEEDED: "bold green",
    JobState.FAILED: "bold red",
    JobState.CANCELLED: "dim",
    JobState.TIMEOUT: "red",
}
"""Colours of job states in tables on a terminal (never when piped, never with NO_COLOR)."""


def state_style(state: str) -> str | None:
    """The colour of a job state on a terminal."""
    return STATE_STYLES.get(str(state))


# ---- cell formatters ------------------------------------------------------------------------

_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|[+-]\d\d:?\d\d)?$")


def moment_of(value: datetime | str) -> datetime:
    """A timestamp as the API writes it in JSON (`2026-11-30T16:15:45.5Z`), or already a datetime;
    one without a zone means UTC, as the API speaks UTC."""
    from datetime import datetime

    if isinstance(value, str):
        found = _ISO.match(value)
        if found is None:
            raise ValueError(f"{value!r} is not an ISO timestamp")
        year, month, day, hour, minute, second = (int(n) for n in found.groups()[:6])
        micro = int((found[7] or "0")[:6].ljust(6, "0"))
        value = datetime(year, month, day, hour, minute, second, micro, tzinfo=_zone(found[8]))
    return value.replace(tzinfo=utc()) if value.tzinfo is None else value


def utc() -> timezone:
    """UTC (`datetime.UTC` is Python 3.11+; this module runs on 3.8)."""
    from datetime import timezone

    return timezone.utc  # noqa: UP017


def _zone(text: str | None) -> timezone:
    from datetime import timedelta, timezone

    if not text or text == "Z":
        return utc()
    sign = -1 if text[0] == "-" else 1
    digits = text[1:].replace(":", "")
    return timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))


def when(moment: datetime | str | None) -> str | None:
    """A timestamp in the reader's local time, to the second."""
    if moment is None:
        return None
    return moment_of(moment).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def age(moment: datetime | str | None, now: datetime) -> str | None:
    """How long ago, as kubectl prints AGE: `45s`, `12m`, `3h20m`, `2d4h`."""
    if moment is None:
        return None
    seconds = max(int((now - moment_of(moment)).total_seconds()), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        hours, minutes = divmod(seconds // 60, 60)
        return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"
    days, hours = divmod(seconds // 3600, 24)
    return f"{days}d{hours}h" if hours else f"{days}d"


def duration(seconds: float | None) -> str:
    """Seconds as `1h02m03s`, `4m05s` or `7s`."""
    total = round(seconds or 0)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def gpu_list(indices: Sequence[int]) -> str:
    """GPU indices with runs collapsed: (0, 1, 2, 3, 6) -> `0-3,6`."""
    runs: list[list[int]] = []
    for index in sorted(indices):
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def placement(workers: Sequence[Any]) -> str | None:
    """Where a job runs: `node-a:gpu0-7 node-b:gpu0-7`, or `node-a` for a CPU job."""
    if not workers:
        return None
    return " ".join(f"{w.node}:gpu{gpu_list(w.gpus)}" if w.gpus else w.node for w in workers)
