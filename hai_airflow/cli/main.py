"""The `hai` command line: every subcommand registered on one typer app, and its one error handler."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from hai_airflow.cli import admin, airflow_cmd, control, nodes, quota, submit
from hai_airflow.cli.connection import PRECEDENCE, ROOT_FLAGS, ServerFlags
from hai_airflow.cli.cp import cp
from hai_airflow.cli.create import create
from hai_airflow.cli.exec_cmd import exec_
from hai_airflow.cli.flags import with_flags
from hai_airflow.cli.instance import instance
from hai_airflow.cli.jobspec import JOB_COMMAND
from hai_airflow.cli.log import log
from hai_airflow.cli.output import error_line, help_without_subcommand
from hai_airflow.cli.queue_cmd import queue
from hai_airflow.cli.res import res
from hai_airflow.cli.serve import serve
from hai_airflow.cli.sim import sim
from hai_airflow.cli.task import task
from hai_airflow.cli.usage import usage
from hai_airflow.cli.wait import wait


def usage_line(error: typer.TyperException, fallback: str) -> str:
    """typer's own refusal (a bad value, a missing or unknown flag) as one `Error:` line naming the
    command's help; the message is typer's, as it formats it, on one line. `fallback` names the
    command when typer's error comes without its context."""
    message = " ".join(error.format_message().split()).rstrip(".")
    # click's "(Possible options: --user)" in the words of its "Did you mean 'task'?"
    message = re.sub(
        r" \(Possible options: ([^)]*)\)$",
        lambda m: f". Did you mean {'one of ' if ',' in m[1] else ''}{m[1]}?",
        message,
    )
    ctx = getattr(error, "ctx", None)
    command = ctx.command_path if ctx is not None else fallback
    end = "" if message.endswith("?") else "."
    return error_line(f"{message}{end} See `{command} --help`")


def command_named(group: Any, words: Sequence[str]) -> str:
    """`hai quota set` for `quota set --user`: the subcommands named in `words`, skipping flags."""
    path, command = ["hai"], group
    for word in words:
        subcommands = getattr(command, "commands", None)
        if not subcommands:
            break
        if word in subcommands:
            path.append(word)
            command = subcommands[word]
    return " ".join(path)


class HaiGroup(TyperGroup):
    """The root command: typer's usage errors and unexpected failures end as one `Error:` line with
    exit code 2 (bad usage) or 1 (failed), never a usage block or a traceback."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        # Flags before the command last for this run only (the test runner calls main many times).
        reset = ROOT_FLAGS.set(ServerFlags())
        try:
            result = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except typer.TyperException as error:
            words = sys.argv[1:] if args is None else args
            typer.echo(usage_line(error, command_named(self, words)), err=True)
            sys.exit(error.exit_code)
        except typer.Abort as error:
            if isinstance(error.__cause__, KeyboardInterrupt):
                # Ctrl-C, wherever it landed (click turns it into Abort): the shell's 128 + SIGINT.
                sys.exit(130)
            typer.echo(error_line("aborted"), err=True)
            sys.exit(1)
        except Exception as error:
            if os.environ.get("HAI_DEBUG"):
                raise
            typer.echo(
                f"Error: hai failed unexpectedly ({type(error).__name__}: {error}). "
                "Rerun with HAI_DEBUG=1 to see the traceback, and report it.",
                err=True,
            )
            sys.exit(1)
        finally:
            ROOT_FLAGS.reset(reset)
        code = result if isinstance(result, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code


app = typer.Typer(
    name="hai",
    help="HAI managed GPU training: submit CPU, standalone and distributed (Horovod) jobs, watch them, "
    "and manage high-priority quota.\n\n"
    "Typical use: `hai res` (pick a resource package) -> `hai create ... --wait` -> `hai task` -> "
    "`hai instance 42` -> `hai log 125065 -f`.\n\n"
    "Output: listings take -o json|yaml|wide|name (--json = -o json) and --no-headers; piped, tables "
    "are plain space-aligned text; colour only on a terminal and never with NO_COLOR.\n\n"
    f"Connection: {PRECEDENCE}\n\n"
    "Exit codes: 0 ok, 1 the operation failed or was refused, 2 bad usage or input; `hai wait` and "
    "--wait: 0 succeeded, 1 failed, cancelled or out of time (TIMEOUT), 124 timed out.\n\n"
    "`hai --install-completion` installs shell completion (task and instance ids come from the server).",
    cls=HaiGroup,
    rich_markup_mode=None,
    invoke_without_command=True,
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
@with_flags()
def root(
    ctx: typer.Context,
    connection: ServerFlags,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print hai's version and exit."
        ),
    ] = False,
) -> None:
    """HAI managed GPU training from the shell."""
    ROOT_FLAGS.set(connection)
    help_without_subcommand(ctx)


app.command()(res)
app.command(context_settings=JOB_COMMAND)(create)
app.add_typer(submit.app, name="submit")
app.command()(wait)
app.command()(task)
app.command()(instance)
app.command()(log)
app.command(name="exec")(exec_)
app.command()(cp)
app.command()(control.promote)
app.command()(control.cancel)
app.command()(control.suspend)
app.command()(control.resume)
app.command()(control.requeue)
app.command()(control.hold)
app.command()(control.release)
app.command()(queue)
app.add_typer(quota.app, name="quota")
app.command()(nodes.nodes)
app.add_typer(nodes.app, name="node")
app.command()(usage)
app.command()(serve)
app.command()(sim)
app.add_typer(admin.app, name="admin")
app.add_typer(airflow_cmd.app, name="airflow")
