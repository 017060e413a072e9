"""Apply the config file to the store at start: groups, users and their tokens, nodes."""

from __future__ import annotations

import getpass
import json
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from hai_airflow.server.config import ServerConfig
from hai_airflow.server.store import Store
from hai_airflow.server.tables import GroupRow, NodeRow, UserRow
from hai_airflow.spec import NodeConfig


def _quota_json(gpus: int | None) -> str:
    return json.dumps(gpus)


def apply_config(store: Store, config: ServerConfig, nodes: Sequence[NodeConfig]) -> None:
    """Create or update what the file names; keep quotas changed through the API unless the file changed.

    Users and groups no longer in the file are kept (their jobs still refer to them); nodes are
    replaced by the file's, since capacity is whatever the operator says it is now.
    """
    with store.write() as s:
        store.lock_setup(s)
        _apply_groups(s, config)
        s.flush()
        _apply_users(s, config)
        _apply_nodes(s, nodes)


def _apply_groups(s: Session, config: ServerConfig) -> None:
    groups = {g.name: g for g in s.scalars(select(GroupRow))}
    for g in config.groups:
        row = groups.get(g.name)
        wanted = _quota_json(g.quota_gpus)
        if row is None:
            row = GroupRow(name=g.name, quota_gpus=g.quota_gpus, config_quota=wanted)
            s.add(row)
        elif row.config_quota != wanted:
            row.quota_gpus, row.config_quota = g.quota_gpus, wanted
        row.admins = json.dumps(list(g.admins))


def _apply_users(s: Session, config: ServerConfig) -> None:
    users = {u.name: u for u in s.scalars(select(UserRow))}
    configured = {u.token: u.name for u in config.users if u.token}
    for holder in users.values():
        # A token the file now gives to someone else is taken away from its old holder.
        if holder.token in configured and configured[holder.token] != holder.name:
            holder.token = secrets.token_urlsafe(24)
    s.flush()
    for u in config.users:
        row = users.get(u.name)
        wanted = _quota_json(u.quota_gpus)
        if row is None:
            token = u.token or secrets.token_urlsafe(24)
            row = UserRow(name=u.name, token=token, quota_gpus=u.quota_gpus, config_quota=wanted)
            s.add(row)
        elif row.config_quota != wanted:
            row.quota_gpus, row.config_quota = u.quota_gpus, wanted
        if u.token:
            row.token = u.token
        row.group_name = u.group
        row.role = u.role


def _apply_nodes(s: Session, nodes: Sequence[NodeConfig]) -> None:
    existing = {n.name: n for n in s.scalars(select(NodeRow))}
    wanted = {n.name for n in nodes}
    for name, old in existing.items():
        if name not in wanted:
            s.delete(old)
    for n in nodes:
        row = existing.get(n.name) or NodeRow(name=n.name)
        row.gpu_type, row.gpus, row.cpus = n.gpu_type, n.gpus, n.cpus
        row.memory_gb, row.virtual = n.memory_gb, n.virtual
        s.add(row)


def local_token_user(config: ServerConfig) -> str | None:
    """Whose token goes to `$HAI_HOME/token`: the OS user if configured, else the first platform admin."""
    try:
        me = getpass.getuser()
    except (KeyError, OSError):
        me = ""
    names = [u.name for u in config.users]
    if me in names:
        return me
    admins = [u.name for u in config.users if u.role == "platform_admin"]
    return admins[0] if admins else None


def write_token_file(store: Store, config: ServerConfig, home: Path) -> Path | None:
    """Write the local user's token (mode 0600) so the client on this machine picks it up."""
    name = local_token_user(config)
    if name is None:
        return None
    with store.read() as s:
        token = s.scalar(select(UserRow.token).where(UserRow.name == name))
    if token is None:
        return None
    home.mkdir(parents=True, exist_ok=True)
    path = home / "token"
    tmp = home / f".token.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    os.replace(tmp, path)
    return path
