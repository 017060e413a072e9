"""Acting for another user: which service identity may act for whom (a user's `acts_for`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from hai_airflow.spec import ON_BEHALF_OF

__all__ = ["EVERYONE", "GROUP_PREFIX", "ON_BEHALF_OF", "covers", "entry_problem"]

EVERYONE = "*"
GROUP_PREFIX = "group:"


def covers(acts_for: Sequence[str], user: str, group: str) -> bool:
    """A service acts for the users it names, the members of each `group:<name>`, and anyone with `*`."""
    return any(entry in (EVERYONE, user, GROUP_PREFIX + group) for entry in acts_for)


def entry_problem(entry: str, users: Collection[str], groups: Collection[str]) -> str | None:
    """Why one `acts_for` entry names nobody (an unknown user or group), or None when it is usable."""
    if entry == EVERYONE:
        return None
    if entry.startswith(GROUP_PREFIX):
        group = entry.removeprefix(GROUP_PREFIX)
        if group in groups:
            return None
        return f"group {group!r} is not defined; add a [[groups]] entry with name = {group!r}, or remove it"
    if entry in users:
        return None
    return (
        f"{entry!r} is not a configured user; add a [[users]] entry, or write "
        f'"{GROUP_PREFIX}<name>" for a group\'s members or "{EVERYONE}" for everyone'
    )
