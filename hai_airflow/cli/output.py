"""Everything the CLI prints: the one listing function (table or JSON), messages and errors."""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, NoReturn

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer._click.exceptions import BadParameter, MissingParameter, NoSuchOption, UsageError

from hai_airflow.spec import WorkerPlacementView

PIPE_WIDTH = 240
"""Table width when stdout is not a terminal, wide enough that each row stays on one line for grep/awk."""

NONE = "-"


@dataclass(frozen=True)
class Column:
    """A table column: its header and how a row renders in it."""

    header: str
    cell: Callable[[Any], object]
    justify: Literal["left", "right"] = "left"


@dataclass(frozen=True)
class Section:
    """A table printed below the main one for people; in JSON it is already nested in the data."""

    title: str
    rows: Sequence[BaseModel]
    columns: Sequence[Column]


def emit(
    data: BaseModel | Sequence[BaseModel],
    columns: Sequence[Column],
    *,
    as_json: bool,
    title: str | None = None,
    sections: Sequence[Section] = (),
    empty: str = "nothing to show",
) -> None:
    """Print a listing (or one record): a rich table for people, or JSON keyed by API field names."""
    if as_json:
        payload: Any = (
            data.model_dump(mode="json")
            if isinstance(data, BaseModel)
            else [row.model_dump(mode="json") for row in data]
        )
        typer.echo(json.dumps(payload, ensure_ascii=False, indent=2))
        return
    tables: list[Table] = []
    if isinstance(data, BaseModel):
        tables.append(_record_table(data, columns, title))
    elif data:
        tables.append(_rows_table(data, columns, title))
    else:
        note(empty)
    tables += [_rows_table(s.rows, s.columns, s.title) for s in sections if s.rows]
    _print_tables(tables)


def say(line: str) -> None:
    """A one-line result on stdout (e.g. `created task 42`), kept plain so scripts can cut it."""
    typer.echo(line)


def note(message: str) -> None:
    """A message for the person at the terminal, on stderr so it never mixes into data."""
    typer.echo(message, err=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print `Error: what failed. How to fix it.` on stderr and exit (1 refused/failed, 2 bad input)."""
    text = message.strip()
    if not text.endswith("."):
        text += "."
    typer.echo(f"Error: {text}", err=True)
    raise typer.Exit(code)


def usage_error(message: str) -> NoReturn:
    """Bad flags or input: exit 2."""
    fail(message, 2)


def usage_problem(error: UsageError) -> str:
    """typer's own usage error (bad value, missing or unknown flag) as `what failed`, naming the flag."""
    if isinstance(error, MissingParameter):
        kind = error.param_type or (error.param.param_type_name if error.param is not None else "parameter")
        flag = _flag(error)
        text = f"missing {kind} {flag}" if flag else f"missing {kind}"
        return f"{text}: {_sentence(error.message)}" if error.message else text
    if isinstance(error, BadParameter):
        flag = _flag(error)
        problem = _sentence(error.message.removeprefix("Value error, "))
        value, one_of, choices = problem.partition(" is not one of ")
        if one_of:
            problem = value + one_of + ", ".join(choice.strip("'") for choice in choices.split(", "))
        return f"invalid value for {flag}: {problem}" if flag else f"invalid value: {problem}"
    if isinstance(error, NoSuchOption):
        text = f"no such option {error.option_name}"
        if error.possibilities:
            text += f" (did you mean {' or '.join(sorted(error.possibilities))}?)"
        return text
    # Click quotes flags ('--mode'); the rest of the CLI names them bare.
    return re.sub(r"'(-[^' ]+)'", r"\1", _sentence(error.format_message()))


def _flag(error: BadParameter) -> str:
    if error.param_hint is not None:
        hints = [error.param_hint] if isinstance(error.param_hint, str) else list(error.param_hint)
        return " / ".join(hint.strip("'") for hint in hints)
    param = error.param
    if param is None:
        return ""
    if param.param_type_name == "option" and param.opts:
        # The first long spelling: `--instance-id`, not its `--instance_id` alias.
        return next((opt for opt in param.opts if opt.startswith("--")), param.opts[0])
    return param.get_error_hint().strip("'")


def _sentence(text: str) -> str:
    """A message as the middle of our `Error:` line: lower-case start, no final stop."""
    text = text.strip().rstrip(".")
    # Only a capitalised word is lowered; `GPU ...` stays as it is.
    return text[:1].lower() + text[1:] if text[1:2].islower() else text


def _print_tables(tables: Sequence[Table]) -> None:
    # Resolved per call, so tables go to whatever sys.stdout is now (a terminal, a pipe, a test runner).
    if sys.stdout.isatty():
        console = Console(file=sys.stdout, highlight=False, emoji=False)
        for table in tables:
            console.print(table)
        return
    # Piped: plain text, one row per line, without the padding rich leaves at line ends.
    buffer = io.StringIO()
    console = Console(file=buffer, width=PIPE_WIDTH, highlight=False, emoji=False, color_system=None)
    for table in tables:
        console.print(table)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines()))


def _cell(value: object) -> Text:
    # Text, not a markup string: a task named "[exp] 训练" must print as written.
    return Text(NONE if value is None or value == "" else str(value))


def _rows_table(rows: Sequence[BaseModel], columns: Sequence[Column], title: str | None) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for column in columns:
        table.add_column(column.header, justify=column.justify, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(column.cell(row)) for column in columns))
    return table


def _record_table(record: BaseModel, columns: Sequence[Column], title: str | None) -> Table:
    table = Table(title=title, title_justify="left", show_header=False, show_edge=False, pad_edge=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for column in columns:
        table.add_row(column.header, _cell(column.cell(record)))
    return table


def when(moment: datetime | None) -> str | None:
    """A timestamp in the reader's local time, to the second."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        # The API speaks UTC; a store that drops the zone still means UTC.
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S")


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
