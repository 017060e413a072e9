"""The `hai` command line: every subcommand on one typer app, built when first used, and its one error
handler."""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer._coercion import RuntimeParam, build_runtime_param
from typer.core import TyperCommand, TyperGroup

from hai_airflow.cli.connection import PRECEDENCE, ROOT_FLAGS, ServerFlags
from hai_airflow.cli.flags import with_flags
from hai_airflow.cli.output import error_line, help_without_subcommand

if TYPE_CHECKING:
    from typer._click import Command, Context, HelpFormatter, Parameter
    from typer._click.shell_completion import CompletionItem


@dataclass(frozen=True)
class Lazy:
    """A command of the root, named by where it is declared: `attr` of `hai_airflow.cli.<module>`, a
    command function or a typer app of subcommands; `settings`, as `<module>.<attr>`, the command's
    context settings. `summary`, the first paragraph of its help, lists it (`hai --help`, completing a
    command name) without building it, for a command whose flags need heavy modules to build."""

    module: str
    attr: str
    settings: str | None = None
    summary: str | None = None


COMMANDS: dict[str, Lazy] = {
    "res": Lazy("res", "res"),
    "create": Lazy("create", "create", settings="jobspec.JOB_COMMAND"),
    "wait": Lazy("wait", "wait"),
    "task": Lazy("task", "task"),
    "instance": Lazy("instance", "instance"),
    "log": Lazy("log", "log"),
    "exec": Lazy("exec_cmd", "exec_"),
    "cp": Lazy("cp", "cp"),
    "promote": Lazy("control", "promote"),
    "cancel": Lazy("control", "cancel"),
    "suspend": Lazy("control", "suspend"),
    "resume": Lazy("control", "resume"),
    "requeue": Lazy("control", "requeue"),
    "hold": Lazy("control", "hold"),
    "release": Lazy("control", "release"),
    "queue": Lazy("queue_cmd", "queue"),
    "nodes": Lazy("nodes", "nodes"),
    "usage": Lazy("usage", "usage"),
    "serve": Lazy("serve", "serve"),
    # Its flags name the planner's policies and the simulator's defaults.
    "sim": Lazy(
        "sim",
        "sim",
        summary="Replay a job trace through the scheduler on a virtual clock and report what happened.",
    ),
    "submit": Lazy("submit", "app"),
    "quota": Lazy("quota", "app"),
    "node": Lazy("nodes", "app"),
    "admin": Lazy("admin", "app"),
    "airflow": Lazy("airflow_cmd", "app"),
}
"""The root's commands in the order `hai --help` lists them (commands, then groups of commands). A
command line builds (and imports the module of) only the command it runs, so `hai --version` and
`hai task` load no other command's dependencies; `hai --help` and completing a command name build
every one without a summary."""


class LazyCommands(MutableMapping[str, "Command"]):
    """The root's commands by name, each built when first looked up; while `listing()`, one not built
    yet that has a summary is a stand-in holding only that, which is all a listing reads of it."""

    def __init__(self, entries: Mapping[str, Lazy]) -> None:
        self._entries = entries
        self._names = list(entries)
        self._built: dict[str, Command] = {}
        self._listing = False

    @contextmanager
    def listing(self) -> Iterator[None]:
        self._listing = True
        try:
            yield
        finally:
            self._listing = False

    def __getitem__(self, name: str) -> Command:
        if name in self._built:
            return self._built[name]
        if name not in self._names:
            raise KeyError(name)
        summary = self._entries[name].summary
        if self._listing and summary is not None:
            return TyperCommand(name, help=summary)
        self._built[name] = build(name)
        return self._built[name]

    def __setitem__(self, name: str, command: Command) -> None:
        if name not in self._names:
            self._names.append(name)
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self._names:
            raise KeyError(name)
        self._names.remove(name)
        self._built.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


@dataclass(frozen=True)
class DeferredCoercion(RuntimeParam):
    """typer's coercion of one parameter, made when a value first needs it: typer makes a pydantic
    TypeAdapter for every parameter it reads, even one left unset, and pydantic costs more to import
    than the rest of `hai --version` or `hai task --help` together. Unset values need none."""

    descriptor: Any = None

    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        made = build_runtime_param(self.descriptor)
        param._runtime_param = made
        return made._coerce_value(value, param=param, ctx=ctx)


def defer(params: Sequence[Parameter]) -> None:
    """Each of typer's parameters among `params` coerced by a `DeferredCoercion` until a value needs it."""
    for param in params:
        descriptor = getattr(param, "type_descriptor", None)
        if descriptor is not None and getattr(param, "_runtime_param", False) is None:
            deferred = DeferredCoercion(descriptor.parameter_info, descriptor.annotation, descriptor)
            setattr(param, "_runtime_param", deferred)  # noqa: B010 (typer's own slot for it)


def defer_coercion(command: Command) -> Command:
    """`command` with its parameters' and its subcommands' coercion deferred, the help option's too
    (made when the command is first parsed)."""
    listed = command.get_params

    def get_params(ctx: Context) -> list[Parameter]:
        params = listed(ctx)
        defer(params)
        return params

    command.get_params = get_params  # type: ignore[method-assign]
    for sub in getattr(command, "commands", {}).values():
        defer_coercion(sub)
    return command


def build(name: str) -> Command:
    """The click command of one of `COMMANDS`, registered as `app` registers a command of its own, so
    it gets the root's settings (help rendering, suggestions)."""
    entry = COMMANDS[name]
    module = importlib.import_module(f"hai_airflow.cli.{entry.module}")
    target = getattr(module, entry.attr)
    holder = typer.Typer(
        rich_markup_mode=app.rich_markup_mode,
        pretty_exceptions_short=app.pretty_exceptions_short,
        suggest_commands=app.suggest_commands,
    )
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=name)
    else:
        settings = None
        if entry.settings:
            where, _, attr = entry.settings.rpartition(".")
            settings = getattr(importlib.import_module(f"hai_airflow.cli.{where}"), attr)
        holder.command(name=name, context_settings=settings)(target)
    return defer_coercion(typer.main.get_group(holder).commands[name])


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
    exit code 2 (bad usage) or 1 (failed), never a usage block or a traceback. Its commands are
    `COMMANDS`, each built when first needed."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lazy = LazyCommands(COMMANDS)
        self.lazy.update(self.commands)
        self.commands = self.lazy

    def get_params(self, ctx: Context) -> list[Parameter]:
        # With the help and completion options, which typer adds only now.
        params = super().get_params(ctx)
        defer(params)
        return params

    def list_commands(self, ctx: Context) -> list[str]:
        # By name alone: typer's own builds every command to list them.
        return list(self.commands)

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        with self.lazy.listing():
            super().format_commands(ctx, formatter)

    def shell_complete(self, ctx: Context, incomplete: str) -> list[CompletionItem]:
        with self.lazy.listing():
            return super().shell_complete(ctx, incomplete)

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
        from importlib.metadata import PackageNotFoundError, version

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


if __name__ == "__main__":
    app(prog_name="hai")
