"""`hai quota`: high-priority GPU quotas and who uses them; `hai quota set` for admins."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from hai_airflow.cli.connection import ServerFlags, connect
from hai_airflow.cli.flags import with_flags
from hai_airflow.cli.output import Column, OutputFlags, Section, emit, say, usage_error

if TYPE_CHECKING:
    from hai_airflow.spec import QuotaView

app = typer.Typer(
    help="Show high-priority GPU quotas and their use; group admins set members' quotas.",
    rich_markup_mode=None,
)


def limit(gpus: int | None) -> str:
    """A quota as people read it: a number, or `unlimited`."""
    return "unlimited" if gpus is None else str(gpus)


def use(used: int, quota: int | None) -> str:
    """`6/8 GPUs`, or `6 GPUs (unlimited)`."""
    return f"{used} GPUs (unlimited)" if quota is None else f"{used}/{quota} GPUs"


QUOTA_COLUMNS = (
    Column("group", lambda q: q.group),
    Column("group high-priority use", lambda q: use(q.group_used_gpus, q.group_quota_gpus)),
    Column("user", lambda q: q.user),
    Column(
        "your high-priority use",
        lambda q: None if q.user is None else use(q.user_used_gpus, q.user_quota_gpus),
    ),
)

GROUP_COLUMNS = (
    Column("GROUP", lambda q: q.group),
    Column("QUOTA", lambda q: limit(q.group_quota_gpus), "right"),
    Column("USED", lambda q: q.group_used_gpus, "right"),
    Column("USERS", lambda q: ", ".join(f"{u.user} {u.used_gpus}" for u in q.users)),
)

USER_COLUMNS = (
    Column("USER", lambda u: u.user),
    Column("HIGH-PRIORITY GPUS", lambda u: u.used_gpus, "right"),
    Column("PERSONAL QUOTA", lambda u: "group's" if u.quota_gpus is None else u.quota_gpus, "right"),
)


@app.callback(invoke_without_command=True)
@with_flags()
def quota(
    ctx: typer.Context,
    all_: Annotated[bool, typer.Option("--all", help="Every group you may see, one row each.")] = False,
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """Your and your group's high-priority GPU quota, its use, and who uses it."""
    if ctx.invoked_subcommand is not None:
        return
    with connect(connection) as client:
        if all_:
            emit(client.quotas(), GROUP_COLUMNS, out=out, empty="no groups to show", name=lambda q: q.group)
            return
        view = client.quota()
    _show(view, out)


@app.command("set")
@with_flags()
def set_quota(
    user: Annotated[
        str | None, typer.Option("--user", metavar="TEXT", help="Set this member's quota (group admins).")
    ] = None,
    group: Annotated[
        str | None, typer.Option("--group", metavar="TEXT", help="Set this group's quota (platform admins).")
    ] = None,
    gpus: Annotated[
        int | None, typer.Option("--gpus", metavar="INTEGER", help="High-priority GPUs allowed (0 or more).")
    ] = None,
    clear: Annotated[
        bool,
        typer.Option(
            "--clear",
            help="Remove the limit instead: a user then shares the group's quota; a group becomes unlimited.",
        ),
    ] = False,
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """Set a user's (group admin) or a group's (platform admin) high-priority GPU quota."""
    if (user is None) == (group is None):
        usage_error("give exactly one of --user and --group. See `hai quota set --help`")
    if (gpus is None) == (not clear):
        usage_error("give exactly one of --gpus N and --clear. See `hai quota set --help`")
    if gpus is not None and gpus < 0:
        usage_error("--gpus must be 0 or more. Use --clear to remove the limit")
    with connect(connection) as client:
        if user is not None:
            view = client.set_user_quota(user, gpus)
            target = f"user {user}"
        else:
            assert group is not None
            view = client.set_group_quota(group, gpus)
            target = f"group {group}"
    if out.format not in ("table", "wide"):
        emit(view, QUOTA_COLUMNS, out=out, name=lambda q: q.group)
    elif gpus is not None:
        say(f"set the high-priority quota of {target} to {gpus} GPUs")
    elif user is not None:
        say(f"removed the personal quota of {target}; the group's quota applies")
    else:
        say(f"removed the quota of {target}; it is unlimited")


def _show(view: QuotaView, out: OutputFlags) -> None:
    users = Section("Who uses it", view.users, USER_COLUMNS)
    emit(view, QUOTA_COLUMNS, out=out, title="High-priority quota", sections=(users,), name=lambda q: q.group)
