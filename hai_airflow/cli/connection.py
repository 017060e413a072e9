"""Where a command connects (`--server`, `--token`, `--region`); client failures as exit codes.

Every command's flags import this module, so the client (and pydantic behind it) loads only when a
command first connects."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from hai_airflow.cli.output import fail, note

if TYPE_CHECKING:
    from hai_airflow.client import AsyncHaiClient, HaiClient, HaiError

PRECEDENCE = (
    "Each of --server, --token and --region is taken from the flag, else its variable (HAI_SERVER, "
    "HAI_TOKEN, HAI_REGION), else $HAI_HOME/client.toml (`server`, `default_region`, [regions]) and "
    "$HAI_HOME/token; a token file named by HAI_TOKEN_FILE (in a job, its credential) comes between "
    "HAI_TOKEN and $HAI_HOME/token; a flag after the command beats one before it. --region picks the "
    "server from [regions] and beats HAI_SERVER; --server beats --region."
)


@dataclass(frozen=True)
class ServerFlags:
    """The global connection flags every command that talks to the server accepts."""

    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            metavar="URL",
            help="URL of the hai server. Default: $HAI_SERVER, else the region's, else http://127.0.0.1:8765.",
            show_default=False,
            rich_help_panel="Connection",
        ),
    ] = None
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            metavar="TOKEN",
            help="API token. Default: $HAI_TOKEN, else the file $HAI_TOKEN_FILE, else $HAI_HOME/token.",
            show_default=False,
            rich_help_panel="Connection",
        ),
    ] = None
    region: Annotated[
        str | None,
        typer.Option(
            "--region",
            metavar="NAME",
            help="Region: a [regions] entry of $HAI_HOME/client.toml. Default: $HAI_REGION, else its "
            "default_region.",
            show_default=False,
            rich_help_panel="Connection",
        ),
    ] = None

    def over(self, outer: ServerFlags) -> ServerFlags:
        """These flags where given, `outer`'s (given before the command) elsewhere."""
        given = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        return dataclasses.replace(outer, **given)


ROOT_FLAGS: ContextVar[ServerFlags] = ContextVar("hai_root_flags", default=ServerFlags())  # noqa: B039 (frozen)
"""The connection flags given before the command (`hai --server URL task`), set by the root callback."""


def client_for(flags: ServerFlags, timeout: float = 30.0) -> HaiClient:
    """A client from the command's flags over the root's, then the environment and $HAI_HOME."""
    from hai_airflow.client import HaiClient, HaiError

    merged = flags.over(ROOT_FLAGS.get())
    try:
        return HaiClient(
            server=merged.server, token=merged.token, region=merged.region, timeout=timeout, on_wait=_waiting
        )
    except HaiError as error:
        raise as_flag_error(error) from None


def as_flag_error(error: HaiError) -> HaiError:
    """The client's refusal of a value the caller gave (`region`) in the words of its flag (`--region`)."""
    if error.field != "region":
        return error
    from hai_airflow.client import HaiError

    fix = (error.fix or "").replace("Give region", "Give --region")
    return HaiError(error.status, f"--region: {error.error}", field="--region", fix=fix)


def _waiting(words: str) -> None:
    """What a command waits for while the server cannot answer yet, on stderr (never in its data)."""
    note(f"hai: {words}")


BAD_INPUT_STATUSES = frozenset({2, 400, 422})
"""Refusals that mean the caller's input was wrong (exit 2); every other refusal is exit 1.
Status 2 is what the client uses for a bad local setting such as an unknown HAI_REGION."""


def exit_code_for(error: HaiError) -> int:
    """2 when the input was wrong, 1 when the operation was refused or failed, or no hai server answered."""
    from hai_airflow.client import HaiUnreachable

    if isinstance(error, HaiUnreachable):
        # The status of another server's answer says nothing about this command's input.
        return 1
    return 2 if error.status in BAD_INPUT_STATUSES else 1


@contextmanager
def failures_as_exit() -> Iterator[None]:
    """Client failures inside the block leave as one `Error:` line and an exit code."""
    from pydantic import ValidationError

    from hai_airflow.client import HaiError

    try:
        yield
    except HaiError as error:
        where = f" (field {error.field})" if error.field and error.field not in error.message else ""
        fail(error.message + where, exit_code_for(error))
    except ValidationError as error:
        fail(
            f"the server's answer did not match what this hai understands ({error.error_count()} "
            "mismatched fields). Install the hai version that matches the server",
            1,
        )


@contextmanager
def connect(flags: ServerFlags) -> Iterator[HaiClient]:
    """A client for the command's body; its failures leave as one `Error:` line and an exit code."""
    with failures_as_exit(), client_for(flags) as client:
        yield client


def async_client_for(flags: ServerFlags, timeout: float = 30.0) -> AsyncHaiClient:
    """The asyncio twin of `client_for`, for waiting on several long-polls at once."""
    from hai_airflow.client import AsyncHaiClient, HaiError

    merged = flags.over(ROOT_FLAGS.get())
    try:
        return AsyncHaiClient(server=merged.server, token=merged.token, region=merged.region, timeout=timeout)
    except HaiError as error:
        raise as_flag_error(error) from None


T = TypeVar("T")

RECONNECT_FOR_SECONDS = 300.0
"""How long a follow or a wait keeps trying to reach a server that answered and went away (e.g. while
it restarts); one that never answered is not waited for."""

RECONNECT_BACKOFF = (0.5, 1.0, 2.0, 5.0)
"""Pauses between reconnect attempts; the last one repeats."""


def reconnect(
    client: HaiClient, ask: Callable[[], T], status: Any = None, within: float = RECONNECT_FOR_SECONDS
) -> T:
    """Ask again, pausing longer each time, until the server that went away answers (what `ask()`
    returns), for at most `within` seconds; then its `HaiUnreachable`. `status`, a rich Status on a
    terminal, says what it waits for."""
    from hai_airflow.client import HaiUnreachable

    deadline = time.monotonic() + within
    attempt = 0
    while True:
        pause = RECONNECT_BACKOFF[min(attempt, len(RECONNECT_BACKOFF) - 1)]
        attempt += 1
        if status is not None:
            status.update(f"lost the server at {client.connection.server}; reconnecting (attempt {attempt})")
        time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
        try:
            return ask()
        except HaiUnreachable:
            if time.monotonic() >= deadline:
                raise
