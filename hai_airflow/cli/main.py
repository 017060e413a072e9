"""The `hai` command line: every subcommand registered on one typer app."""

from __future__ import annotations

import os
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any

import typer

from hai_airflow.cli import airflow_cmd, control, quota, submit
from hai_airflow.cli.create import create
from hai_airflow.cli.instance import instance
from hai_airflow.cli.log import log
from hai_airflow.cli.queue_cmd import queue
from hai_airflow.cli.res import res
from hai_airflow.cli.serve import serve
from hai_airflow.cli.sim import sim
from hai_airflow.cli.task import task


class HaiApp(typer.Typer):
    """The root app: an unexpected failure ends as one `Error:` line, not a traceback."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except Exception as error:
            if os.environ.get("HAI_DEBUG"):
                raise
            typer.echo(
                f"Error: hai failed unexpectedly ({type(error).__name__}: {error}). "
                "Rerun with HAI_DEBUG=1 to see the traceback, and report it.",
                err=True,
            )
            sys.exit(1)


app = HaiApp(
    name="hai",
    help="HAI managed GPU training: submit CPU, standalone and distributed (Horovod) jobs, watch them, "
    "and manage high-priority quota.\n\n"
    "Typical use: `hai res` (pick a resource package) -> `hai create ...` -> `hai task` -> "
    "`hai instance --task-id N` -> `hai log --instance-id M --tail 100`.\n\n"
    "The server is $HAI_SERVER or, by region, the $HAI_REGION entry of $HAI_HOME/client.toml; "
    "`hai COMMAND --help` explains each command.",
    rich_markup_mode=None,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        try:
            typer.echo(f"hai {version('hai-airflow')}")
        except PackageNotFoundError:
            typer.echo("hai (not installed as a package)")
        raise typer.Exit()


@app.callback()
def root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print hai's version and exit."
        ),
    ] = False,
) -> None:
    """HAI managed GPU training from the shell."""


app.command()(res)
app.command()(create)
app.add_typer(submit.app, name="submit")
app.command()(task)
app.command()(instance)
app.command()(log)
app.command()(control.promote)
app.command()(control.cancel)
app.command()(control.suspend)
app.command()(control.resume)
app.command()(queue)
app.add_typer(quota.app, name="quota")
app.command()(serve)
app.command()(sim)
app.add_typer(airflow_cmd.app, name="airflow")
