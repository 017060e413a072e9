"""Everything the CLI prints: the one listing function (table, wide, JSON, YAML, names), messages, errors.

Imported to build every command's flags, so pydantic, rich and the YAML writer load only once something
is printed with them."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import typer

from hai_airflow.cli import flagtable
from hai_airflow.cli.flags import option
from hai_airflow.cli.listing import (
    NONE,
    STATE_STYLES,
    Column,
    Grid,
    Section,
    age,
    csv_text,
    duration,
    error_line,
    gpu_list,
    listing_grids,
    placement,
    plain_table,
    plain_tables,
    record_grid,
    rows_grid,
    state_style,
    when,
)

if TYPE_CHECKING:
    from pydantic import BaseModel
    from rich.console import Console
    from rich.table import Table


__all__ = [
    "NONE",
    "STATE_STYLES",
    "Column",
    "Grid",
    "Section",
    "age",
    "duration",
    "error_line",
    "gpu_list",
    "placement",
    "plain_table",
    "record_grid",
    "rows_grid",
    "state_style",
    "when",
]

Format = Literal["table", "wide", "json", "yaml", "name", "csv"]

if TYPE_CHECKING:
    OutputOption = Any
    JsonOption = Any
    NoHeadersOption = Any
else:
    OutputOption = option(flagtable.OUTPUT)
    JsonOption = option(flagtable.AS_JSON)
    NoHeadersOption = option(flagtable.NO_HEADERS)


@dataclass(frozen=True)
class OutputFlags:
    """How a command prints what it shows: `-o json|yaml|wide|name|csv`, `--json`, `--no-headers`."""

    output: OutputOption = None
    as_json: JsonOption = False
    no_headers: NoHeadersOption = False

    def __post_init__(self) -> None:
        # Checked as the command starts, before anything is asked of the server.
        self.format  # noqa: B018

    @property
    def format(self) -> Format:
        """The one format asked for."""
        try:
            return flagtable.output_format(self.output, self.as_json)  # type: ignore[return-value]
        except ValueError as error:
            usage_error(str(error))

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
        rows = [data] if isinstance(data, BaseModel) else data
        sys.stdout.write(csv_text(rows, columns, not out.no_headers))
        return
    one = isinstance(data, BaseModel)
    if not one and not data:
        note(empty)
    print_grids(listing_grids(data, one, columns, fmt == "wide", not out.no_headers, title, sections))


def help_without_subcommand(ctx: typer.Context) -> None:
    """A command group called alone prints its help on stdout and exits 0, like `git` and `kubectl`."""
    if ctx.invoked_subcommand is None and not ctx.resilient_parsing:
        typer.echo(ctx.get_help())
        raise typer.Exit()


def say(line: str) -> None:
    """A one-line result on stdout (e.g. `created task 42`), kept plain so scripts can cut it."""
    typer.echo(line)


def note(message: str) -> None:
    """A message for the person at the terminal, on stderr so it never mixes into data."""
    typer.echo(message, err=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print `Error: what failed. How to fix it.` on stderr and exit (1 refused/failed, 2 bad input)."""
    typer.echo(error_line(message), err=True)
    raise typer.Exit(code)


def usage_error(message: str) -> NoReturn:
    """Bad flags or input: exit 2."""
    fail(message, 2)


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
    sys.stdout.write(plain_tables(grids))
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
