"""Options every server command shares, and one place that turns client failures into exit codes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import httpx
import pydantic
import typer

from hai_airflow.cli.output import fail
from hai_airflow.client import HaiClient, HaiError

ServerOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        metavar="URL",
        help="URL of the hai server. Default: $HAI_SERVER, else the $HAI_REGION entry of "
        "$HAI_HOME/client.toml [regions], else http://127.0.0.1:8765. "
        "The token comes from $HAI_TOKEN or $HAI_HOME/token.",
        show_default=False,
    ),
]

JsonOption = Annotated[
    bool,
    typer.Option("--json", help="Print JSON with the API's field names instead of a table (for programs)."),
]

BAD_INPUT_STATUSES = frozenset({2, 400, 422})
"""Refusals that mean the caller's input was wrong (exit 2); every other refusal is exit 1.
Status 2 is what the client uses for a bad local setting such as an unknown HAI_REGION."""


def exit_code_for(error: HaiError) -> int:
    """2 when the input was wrong, 1 when the operation was refused or failed."""
    return 2 if error.status in BAD_INPUT_STATUSES else 1


@contextmanager
def connect(server: str | None) -> Iterator[HaiClient]:
    """A client for the command's body; its failures leave as one `Error:` line and an exit code."""
    try:
        with HaiClient(server=server) as client:
            yield client
    except HaiError as error:
        fail(error.message, exit_code_for(error))
    except httpx.InvalidURL as error:
        fail(f"--server {server!r} is not a usable URL ({error}). Give one like http://127.0.0.1:8765", 2)
    except pydantic.ValidationError as error:
        fail(
            f"the server's answer did not match what this hai understands ({error.error_count()} "
            "mismatched fields). Install the hai version that matches the server",
            1,
        )
