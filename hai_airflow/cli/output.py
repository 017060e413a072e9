"""Everything the CLI prints: the one listing function (table, wide, JSON, YAML, names), messages, errors.

Imported to build every command's flags, so pydantic, rich and the YAML writer load only once something
is printed with them."""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn

import typer

from hai_airflow.cli.flags import choice, completes
from hai_airflow.vocabulary import JobState

if TYPE_CHECKING:
    from pydantic import BaseModel
    from rich.console import Console
    from rich.table import Table

    from hai_airflow.spec import JobView, WorkerPlacementView

NONE = "-"

Format = Literal["table", "wide", "json", "yaml", "name", "csv"]

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


@dataclass(frozen=True)
class Column:
    """A table column: its header, how a row renders in it, and whether only `-o wide` shows it."""

    header: str
    cell: Callable[[Any], object]
    justify: Literal["left", "right"] = "left"
    wide: bool = False
    style: Callable[[Any], str | None] | None = None


@dataclass(frozen=True)
class Section:
    """A table printed below the main one for people; in JSON it is already nested in the data."""

    title: str
    rows: Sequence[BaseModel]
    columns: Sequence[Column]


@dataclass(frozen=True)
class OutputFlags:
    """How a command prints what it shows: `-o json|yaml|wide|name|csv`, `--json`, `--no-headers`."""

    output: Annotated[
        Literal["json", "yaml", "wide", "name", "csv"] | None,
        typer.Option(
            "--output",
            "-o",
            metavar="json|yaml|wide|name|csv",
            parser=choice("json", "yaml", "wide", "name", "csv"),
            autocompletion=completes("json", "yaml", "wide", "name", "csv"),
            help="json/yaml: the API's records (for programs); wide: a table with more columns; "
            "name: only the ids, one per line; csv: the wide table's columns as CSV (for a "
            "spreadsheet). Default: a table.",
            show_default=False,
        ),
    ] = None
    as_json: Annotated[bool, typer.Option("--json", help="Same as -o json.")] = False
    no_headers: Annotated[
        bool, typer.Option("--no-headers", help="Print tables without their header line and titles.")
    ] = False

    def __post_init__(self) -> None:
        # Checked as the command starts, before anything is asked of the server.
        if self.as_json and self.output not in (None, "json"):
            usage_error(f"--json and -o {self.output} ask for different formats. Give only one of them")

    @property
    def format(self) -> Format:
        """The one format asked for."""
        if self.as_json:
            return "json"
        return self.output or "table"

    @property
    def is_data(self) -> bool:
        """JSON or YAML: stdout is for a program, so no progress or notes may mix in."""
        return self.format in ("json", "yaml")


TABLE = OutputFlags()
JSON = OutputFlags(as_json=True)


def emit(
    data: BaseModel | Sequence[BaseModel],
    columns: Sequence[Column],
    *,
    out: OutputFlags = TABLE,
    title: str | None = None,
    sections: Sequence[Section] = (),
    empty: str = "nothing to show",
    name: Callable[[Any], object] = lambda row: row.id,
) -> None:
    """Print a listing (or one record) in the format asked for; JSON/YAML keys are API field names."""
    from pydantic import BaseModel

    fmt = out.format
    if fmt in ("json", "yaml"):
        payload: Any = (
            data.model_dump(mode="json")
            if isinstance(data, BaseModel)
            else [row.model_dump(mode="json") for row in data]
        )
        if fmt == "json":
            typer.echo(json.dumps(payload, ensure_ascii=False, indent=2))
        else:
            from hai_airflow.jobfile import to_yaml

            typer.echo(to_yaml(payload))
        return
    if fmt == "name":
        for row in [data] if isinstance(data, BaseModel) else data:
            typer.echo(str(name(row)))
        return
    if fmt == "csv":
        write_csv([data] if isinstance(data, BaseModel) else data, columns, not out.no_headers)
        return
    shown = [c for c in columns if fmt == "wide" or not c.wide]
    headers = not out.no_headers
    tables: list[Grid] = []
    if isinstance(data, BaseModel):
        tables.append(record_grid(data, shown, title if headers else None))
    elif data:
        tables.append(rows_grid(data, shown, title if headers else None, headers))
    else:
        note(empty)
    for s in sections:
        if s.rows:
            tables.append(rows_grid(s.rows, s.columns, s.title if headers else None, headers))
    print_grids(tables)


def write_csv(rows: Sequence[Any], columns: Sequence[Column], headers: bool) -> None:
    """The rows as CSV on stdout, every column (the wide ones too), the cells as a table shows them."""
    writer = csv.writer(sys.stdout, lineterminator="\n")
    if headers:
        writer.writerow(c.header for c in columns)
    writer.writerows(["" if (v := c.cell(row)) is None else _text(v) for c in columns] for row in rows)


def help_without_subcommand(ctx: typer.Context) -> None:
    """A command group called alone prints its help on stdout and exits 0, like `git` and `kubectl`."""
    if ctx.invoked_subcommand is None and not ctx.resilient_parsing:
        typer.echo(ctx.get_help())
        raise typer.Exit()


def say(line: str) -> None:
    """A one-line result on stdout (e.g. `created task 42`), kept plain so scripts can cut it."""
    typer.echo(line)


def standing(job: JobView) -> str:
    """`task 42 is FAILED: git clone failed`: where a task stands and why."""
    return f"task {job.id} is {job.state}" + (f": {job.reason}" if job.reason else "")


def note(message: str) -> None:
    """A message for the person at the terminal, on stderr so it never mixes into data."""
    typer.echo(message, err=True)


def error_line(message: str) -> str:
    """`Error: what failed. How to fix it.` from a message that may lack the final stop."""
    text = message.strip()
    # A question or an exclamation already ends its sentence: no "?." or "!.".
    if not text.endswith((".", "?", "!")):
        text += "."
    return f"Error: {text}"


def fail(message: str, code: int = 1) -> NoReturn:
    """Print `Error: what failed. How to fix it.` on stderr and exit (1 refused/failed, 2 bad input)."""
    typer.echo(error_line(message), err=True)
    raise typer.Exit(code)


def usage_error(message: str) -> NoReturn:
    """Bad flags or input: exit 2."""
    fail(message, 2)


# ---- tables ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    """A table before it is drawn: plain text cells, one style per cell (None = plain)."""

    title: str | None
    headers: tuple[str, ...] | None
    justify: tuple[str, ...]
    rows: tuple[tuple[tuple[str, str | None], ...], ...]
    record: bool = False


def _text(value: object) -> str:
    # One line per row: a newline inside a reason would break `grep` and `awk`.
    return NONE if value is None or value == "" else " ".join(str(value).split())


def _cells(row: Any, columns: Sequence[Column]) -> tuple[tuple[str, str | None], ...]:
    return tuple((_text(c.cell(row)), c.style(row) if c.style else None) for c in columns)


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


def stdout_is_terminal() -> bool:
    """Resolved per call, so output follows whatever sys.stdout is now (a terminal, a pipe, a test runner)."""
    return sys.stdout.isatty()


def colour_allowed() -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    return stdout_is_terminal() and not os.environ.get("NO_COLOR")


def print_grids(grids: Sequence[Grid]) -> None:
    """Draw tables: rich's on a terminal, plain whitespace-aligned text when piped."""
    if not grids:
        return
    if stdout_is_terminal():
        console = terminal_console()
        for grid in grids:
            console.print(_rich_table(grid))
        return
    blocks = [plain_table(grid) for grid in grids]
    sys.stdout.write("\n".join(blocks))
    sys.stdout.flush()


def terminal_console() -> Console:
    """A rich console on the terminal; colourless under NO_COLOR."""
    from rich.console import Console

    return Console(
        file=sys.stdout,
        highlight=False,
        emoji=False,
        no_color=bool(os.environ.get("NO_COLOR")),
        color_system="auto" if colour_allowed() else None,
    )


def _rich_table(grid: Grid) -> Table:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title=grid.title,
        title_justify="left",
        title_style="bold",
        show_header=grid.headers is not None,
        header_style="bold",
        box=None if grid.record else box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
    )
    for i, justify in enumerate(grid.justify):
        header = grid.headers[i] if grid.headers else ""
        style = "bold" if grid.record and i == 0 else None
        table.add_column(header, justify=justify, overflow="fold", style=style)  # type: ignore[arg-type]
    for row in grid.rows:
        # Text, not a markup string: a task named "[exp] 训练" must print as written.
        table.add_row(*(Text(text, style=style or "") for text, style in row))
    return table


def plain_table(grid: Grid) -> str:
    """Columns aligned with spaces (two between columns), no box characters, no colour, no trailing blanks."""
    from rich.cells import cell_len

    lines = [list(grid.headers)] if grid.headers is not None else []
    lines += [[text for text, _ in row] for row in grid.rows]
    widths = [max((cell_len(line[i]) for line in lines), default=0) for i in range(len(grid.justify))]
    out = [grid.title] if grid.title else []
    for line in lines:
        cells = []
        for text, width, justify in zip(line, widths, grid.justify, strict=True):
            pad = " " * (width - cell_len(text))
            cells.append(pad + text if justify == "right" else text + pad)
        out.append("  ".join(cells).rstrip())
    return "".join(line + "\n" for line in out)


# ---- cell formatters ------------------------------------------------------------------------


def state_style(state: str) -> str | None:
    """The colour of a job state on a terminal."""
    return STATE_STYLES.get(state)


def when(moment: datetime | None) -> str | None:
    """A timestamp in the reader's local time, to the second."""
    if moment is None:
        return None
    return _aware(moment).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _aware(moment: datetime) -> datetime:
    # The API speaks UTC; a store that drops the zone still means UTC.
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def age(moment: datetime | None, now: datetime) -> str | None:
    """How long ago, as kubectl prints AGE: `45s`, `12m`, `3h20m`, `2d4h`."""
    if moment is None:
        return None
    seconds = max(int((now - _aware(moment)).total_seconds()), 0)
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


def placement(workers: Sequence[WorkerPlacementView]) -> str | None:
    """Where a job runs: `node-a:gpu0-7 node-b:gpu0-7`, or `node-a` for a CPU job."""
    if not workers:
        return None
    return " ".join(f"{w.node}:gpu{gpu_list(w.gpus)}" if w.gpus else w.node for w in workers)
