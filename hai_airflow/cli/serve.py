"""`hai serve`: run the platform's server (API, store and controller) in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hai_airflow.cli.output import fail

SERVER_DEPENDENCIES = frozenset({"fastapi", "uvicorn", "sqlalchemy", "alembic", "starlette"})


def serve(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            metavar="FILE",
            exists=True,
            dir_okay=False,
            help="Platform config (TOML: nodes, resource packages, groups, users). "
            "Default: $HAI_HOME/config.toml, written on first start from this machine's GPUs "
            "(or virtual ones where there are none).",
        ),
    ] = None,
    host: Annotated[
        str | None,
        typer.Option("--host", metavar="TEXT", help="Address to listen on. Default: the config's."),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option("--port", metavar="INTEGER", help="Port to listen on. Default: the config's."),
    ] = None,
) -> None:
    """Start the hai server here (needs the `server` extra); stop it with Ctrl-C."""
    try:
        # Imported here so every other command works without the server's dependencies installed.
        from hai_airflow.server.serve import main
    except ImportError as error:
        if (error.name or "").split(".")[0] not in SERVER_DEPENDENCIES:
            raise
        fail(f"the server needs {error.name}, which is not installed. Run pip install 'hai-airflow[server]'")
    main(config, host, port)
