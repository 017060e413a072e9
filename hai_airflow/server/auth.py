"""Who is calling: Bearer tokens, roles, a service acting for a user, and which jobs and groups a
caller may act on."""

from __future__ import annotations

import json
from dataclasses import dataclass

from fastapi import Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from hai_airflow.server.acting import ON_BEHALF_OF, covers
from hai_airflow.server.errors import ApiError
from hai_airflow.server.tables import GroupRow, UserRow
from hai_airflow.server.tokens import same_hash, token_hash


@dataclass(frozen=True)
class Caller:
    name: str
    group: str
    role: str
    admin_of: frozenset[str]
    """Groups this caller administers (their own as group_admin, or listed as a group's admin)."""
    via: str | None = None
    """The service identity acting for this user (`X-Hai-On-Behalf-Of`); None when the user calls."""

    @property
    def is_platform_admin(self) -> bool:
        return self.role == "platform_admin"

    @property
    def actor(self) -> str:
        """Who acted, as events record it: the user, and the service when one acted for them."""
        return self.name if self.via is None else f"{self.name} via {self.via}"

    def administers(self, group: str) -> bool:
        return self.is_platform_admin or group in self.admin_of

    def may_see(self, user: str, group: str) -> bool:
        """Users see their own jobs, group admins their group's, platform admins all."""
        return user == self.name or self.administers(group)


_NO_TOKEN_FIX = (
    "Send `Authorization: Bearer <token>`: set HAI_TOKEN or use the $HAI_HOME/token that hai serve wrote"
)


def authenticate(request: Request) -> Caller:
    """The caller of this request: the token's user, or the user its service names in `X-Hai-On-Behalf-Of`."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "missing API token", field="Authorization", fix=_NO_TOKEN_FIX)
    store = request.app.state.ctx.store
    # The lookup is on the keyed hash, so its timing says nothing about the token; the final
    # comparison is constant-time all the same.
    presented = token_hash(store.token_key, token.strip())
    with store.read() as s:
        user = s.scalar(select(UserRow).where(UserRow.token_hash == presented))
        if user is None or not same_hash(user.token_hash, presented):
            raise ApiError(401, "unknown API token", field="Authorization", fix=_NO_TOKEN_FIX)
        named = request.headers.get(ON_BEHALF_OF)
        if named is None:
            return _caller(s, user)
        acted_for = _acted_for(s, user, named)
        via = None if acted_for.name == user.name else user.name
        return _caller(s, acted_for, via)


def _caller(s: Session, user: UserRow, via: str | None = None) -> Caller:
    admin_of = set()
    for g in s.scalars(select(GroupRow)):
        if user.name in json.loads(g.admins or "[]"):
            admin_of.add(g.name)
    if user.role == "group_admin":
        admin_of.add(user.group_name)
    return Caller(
        name=user.name, group=user.group_name, role=user.role, admin_of=frozenset(admin_of), via=via
    )


def _acted_for(s: Session, service: UserRow, named: str) -> UserRow:
    """The user `service` names in the header, if its `acts_for` covers them; otherwise a refusal."""
    if not named.strip():
        raise ApiError(
            400,
            f"{ON_BEHALF_OF} is empty",
            field=ON_BEHALF_OF,
            fix="Send the name of the hai user to act for, or leave the header out to act as yourself",
        )
    acts_for = json.loads(service.acts_for or "[]")
    if not acts_for:
        raise ApiError(
            403,
            f"{service.name} is not a service identity, so it may not act for {named!r}",
            field=ON_BEHALF_OF,
            fix=f"Leave out {ON_BEHALF_OF} to act as {service.name}, or ask the platform admin to give "
            f"{service.name} `acts_for` in its [[users]] entry of the server config",
        )
    user = s.get(UserRow, named)
    if user is None:
        raise ApiError(
            403,
            f"{ON_BEHALF_OF} names {named!r}, who is not a hai user",
            field=ON_BEHALF_OF,
            fix="Name a user of the server config's [[users]] (the Airflow user must have a hai user "
            "of the same name)",
        )
    if not covers(acts_for, user.name, user.group_name):
        raise ApiError(
            403,
            f"{service.name} may not act for {user.name} (group {user.group_name}): "
            f"not in its acts_for {acts_for}",
            field=ON_BEHALF_OF,
            fix=f'Add "{user.name}" or "group:{user.group_name}" to acts_for of user {service.name} in '
            f"the server config, or let {user.name} submit with their own token",
        )
    return user
