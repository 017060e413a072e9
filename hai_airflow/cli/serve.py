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
    check_config: Annotated[
        Path | None,
        typer.Option(
            "--check-config",
            metavar="FILE",
            exists=True,
            dir_okay=False,
            help="Check FILE as `hai serve --config FILE` would at start (the file, the token variables "
            "its users name, the backend's options), print `config FILE is valid` and exit 0, or print "
            "what is wrong and exit 2. Starts nothing and writes nothing.",
        ),
    ] = None,
) -> None:
    """Start the hai server here (needs the `server` extra); stop it with Ctrl-C."""
    if check_config is not None and (config, host, port) != (None, None, None):
        fail("--check-config runs alone. Drop --config, --host and --port", code=2)
    try:
        # Imported here so every other command works without the server's dependencies installed.
        from hai_airflow.server.serve import check_main, main
    except ImportError as error:
        if (error.name or "").split(".")[0] not in SERVER_DEPENDENCIES:
            raise
        fail(f"the server needs {error.name}, which is not installed. Run pip install 'hai-airflow[server]'")
    if check_config is not None:
        check_main(check_config)
        return
    main(config, host, port)
