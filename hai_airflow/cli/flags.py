"""Flag groups: options several commands share, declared once as a dataclass, expanded into each command."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Optional, TypeVar

import typer

from hai_airflow.cli import flagtable

F = TypeVar("F", bound=Callable[..., Any])


def _is_group(annotation: object) -> bool:
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


def _field_parameters(group: type) -> list[inspect.Parameter]:
    hints = typing.get_type_hints(group, include_extras=True)
    parameters = []
    for field in dataclasses.fields(group):
        default = inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
        parameters.append(
            inspect.Parameter(
                field.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hints[field.name]
            )
        )
    return parameters


def with_flags(order: Sequence[str] = ()) -> Callable[[F], F]:
    """Expand every parameter typed as a flag-group dataclass into that group's options.

    The command then receives one instance of the group: `def create(..., job: JobFlags)` gets
    `--max-schedule`, `--shm`, ... in its help and a `JobFlags` at run time. `order` lists parameter
    names to show first, in that order (e.g. the platform document's flag order); the rest follow
    in declaration order.
    """

    def expand(func: F) -> F:
        signature = inspect.signature(func, eval_str=True)
        parameters: list[inspect.Parameter] = []
        groups: dict[str, tuple[type, tuple[str, ...]]] = {}
        for parameter in signature.parameters.values():
            if _is_group(parameter.annotation):
                fields = _field_parameters(parameter.annotation)
                groups[parameter.name] = (parameter.annotation, tuple(f.name for f in fields))
                parameters += fields
            else:
                parameters.append(parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY))
        rank = {name: i for i, name in enumerate(order)}
        parameters.sort(key=lambda p: rank.get(p.name, len(rank)))
        names = [p.name for p in parameters]
        if len(set(names)) != len(names):
            raise TypeError(f"{func.__name__}: a flag group repeats a parameter name ({names})")

        @functools.wraps(func)
        def command(**values: Any) -> Any:
            for name, (group, fields) in groups.items():
                values[name] = group(**{field: values.pop(field) for field in fields})
            return func(**values)

        command.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        return command  # type: ignore[return-value]

    return expand


def choice(*choices: str, upper: bool = False) -> Callable[[str], str]:
    """A parameter type for one of `choices`, in any case; the refusal lists them as the user types them."""

    def parse(value: str) -> str:
        try:
            return flagtable.choose(value, choices, upper)
        except ValueError as error:
            raise typer.BadParameter(str(error)) from None

    return parse


def completes(*choices: str) -> Callable[[str], list[str]]:
    """Shell completion for a `choice` parameter."""

    def complete(incomplete: str) -> list[str]:
        return [c for c in choices if c.casefold().startswith(incomplete.casefold())]

    return complete


def _read_with(flag: flagtable.Flag | flagtable.Argument) -> Callable[[str], Any]:
    """typer's parser for a flag the table reads itself (a duration, an array, a choice)."""

    def parse(value: str) -> Any:
        try:
            return flagtable.read_value(flag, value)
        except ValueError as error:
            raise typer.BadParameter(str(error)) from None

    return parse


_TYPES: dict[str, Any] = {
    flagtable.TEXT: str,
    flagtable.INT: int,
    flagtable.FLOAT: float,
    flagtable.BOOL: bool,
    flagtable.TEXTS: list[str],
    flagtable.INTS: list[int],
    flagtable.DURATION: int,
    flagtable.INDICES: str,
    flagtable.CHOICE: str,
}
_READ_BY_TABLE = (flagtable.DURATION, flagtable.INDICES, flagtable.CHOICE, flagtable.INT, flagtable.FLOAT)
"""Kinds whose values the table reads, so a bad value is refused in the downloadable `hai`'s words."""


def option(flag: flagtable.Flag, **typer_only: Any) -> Any:
    """The typer option of a flag of `flagtable`, as an `Annotated` parameter type; `typer_only` adds
    what only the full CLI has (shell completion from the server)."""
    kind = _TYPES[flag.kind]
    optional = flag.default is None and flag.kind != flagtable.BOOL
    settings: dict[str, Any] = {"help": flag.help, "show_default": flag.show_default}
    if flag.metavar is not None:
        settings["metavar"] = flag.metavar
    if flag.minimum is not None:
        settings["min"] = flag.minimum
    if flag.kind in _READ_BY_TABLE:
        settings["parser"] = _read_with(flag)
    if flag.choices:
        settings["autocompletion"] = completes(*flag.choices)
    made = typer.Option(*flag.names, **{**settings, **typer_only})
    return Annotated[Optional[kind] if optional else kind, made]  # noqa: UP045 (a type built at run time)


def argument(arg: flagtable.Argument, **typer_only: Any) -> Any:
    """The typer argument of a positional of `flagtable`, as an `Annotated` parameter type."""
    kind = _TYPES[arg.kind]
    made = typer.Argument(metavar=arg.metavar, help=arg.help, show_default=False, **typer_only)
    return Annotated[kind if arg.required else Optional[kind], made]  # noqa: UP045
