"""Who is calling: Bearer tokens, roles, and which jobs and groups a caller may act on."""

from __future__ import annotations

import json
from dataclasses import dataclass

from fastapi import Request
from sqlalchemy import select

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

    @property
    def is_platform_admin(self) -> bool:
        return self.role == "platform_admin"

    def administers(self, group: str) -> bool:
        return self.is_platform_admin or group in self.admin_of

    def may_see(self, user: str, group: str) -> bool:
        """Users see their own jobs, group admins their group's, platform admins all."""
        return user == self.name or self.administers(group)


_NO_TOKEN_FIX = (
    "Send `Authorization: Bearer <token>`: set HAI_TOKEN or use the $HAI_HOME/token that hai serve wrote"
)


def authenticate(request: Request) -> Caller:
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
        admin_of = set()
        for g in s.scalars(select(GroupRow)):
            if user.name in json.loads(g.admins or "[]"):
                admin_of.add(g.name)
        if user.role == "group_admin":
            admin_of.add(user.group_name)
        return Caller(name=user.name, group=user.group_name, role=user.role, admin_of=frozenset(admin_of))
