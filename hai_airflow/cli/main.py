"""The `hai` command line: every subcommand registered on one typer app."""

from __future__ import annotations

import os
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any, NoReturn

import typer
from typer._click import Context
from typer._click.exceptions import NoArgsIsHelpError, UsageError
from typer.core import TyperGroup

from hai_airflow.cli import airflow_cmd, control, quota, submit
from hai_airflow.cli.create import create
from hai_airflow.cli.instance import instance
from hai_airflow.cli.log import log
from hai_airflow.cli.output import usage_error, usage_problem
from hai_airflow.cli.queue_cmd import queue
from hai_airflow.cli.res import res
from hai_airflow.cli.serve import serve
from hai_airflow.cli.sim import sim
from hai_airflow.cli.task import task

ARGS = "hai.args"
"""Where the root context keeps the command line, to name the command of an error that comes without one."""


class HaiGroup(TyperGroup):
    """The root command: typer's own usage errors (a bad --mode, a missing or unknown flag, a word for a
    number) end as one `Error: ... See `hai COMMAND --help`.` line and exit 2, like the CLI's own checks."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: Context | None = None, **extra: Any
    ) -> Context:
        given = list(args)
        try:
            ctx = super().make_context(info_name, args, parent, **extra)
        except UsageError as error:
            if isinstance(error, NoArgsIsHelpError) or extra.get("resilient_parsing"):
                raise
            refuse(error, info_name or "hai")
        ctx.meta[ARGS] = given
        return ctx

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as error:
            if isinstance(error, NoArgsIsHelpError) or ctx.resilient_parsing:
                raise
            refuse(error, command_path(ctx, ctx.meta.get(ARGS, [])))


def refuse(error: UsageError, command: str) -> NoReturn:
    """One `Error:` line for a usage error; `command` is the fallback for errors click raises without a
    context."""
    if error.ctx is not None:
        command = error.ctx.command_path
    usage_error(f"{usage_problem(error)}. See `{command} --help`")


def command_path(ctx: Context, args: list[str]) -> str:
    """`hai quota set` for `hai quota set --user`: the subcommands named in `args`, skipping flags."""
    path, command = [ctx.command_path], ctx.command
    for word in args:
        if not isinstance(command, TyperGroup):
            break
        sub = command.get_command(ctx, word)
        if sub is not None:
            path.append(word)
            command = sub
    return " ".join(path)


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
    cls=HaiGroup,
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
