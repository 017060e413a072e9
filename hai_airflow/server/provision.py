"""Apply the config file to the store at start: groups, users and their tokens, nodes."""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from hai_airflow.server.config import ServerConfig
from hai_airflow.server.store.database import Store
from hai_airflow.server.store.tables import GroupRow, NodeRow, SettingRow, UserRow
from hai_airflow.server.store.tokens import key_check, new_token, same_hash, token_hash
from hai_airflow.spec import NodeConfig


def _quota_json(gpus: int | None) -> str:
    return json.dumps(gpus)


def apply_config(store: Store, config: ServerConfig, nodes: Sequence[NodeConfig]) -> dict[str, str]:
    """Create or update what the file names; keep quotas changed through the API unless the file changed.

    Users and groups no longer in the file are kept (their jobs still refer to them); nodes are
    replaced by the file's, since capacity is whatever the operator says it is now. Returns the tokens
    generated for new users without one in the file: the only moment they exist in plain text.
    """
    with store.write() as s:
        store.lock_setup(s)
        _apply_groups(s, config)
        s.flush()
        generated = _apply_users(s, config, store.token_key)
        _apply_nodes(s, nodes)
    return generated


def claim_token_key(store: Store) -> bool:
    """Record the token key's fingerprint on first use; False when the store already has another key's."""
    wanted = key_check(store.token_key)
    with store.write() as s:
        store.lock_setup(s)
        row = s.get(SettingRow, "token_key_check")
        if row is None:
            s.add(SettingRow(name="token_key_check", value=wanted))
            return True
        return same_hash(row.value, wanted)


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


def configured_tokens(config: ServerConfig) -> dict[str, str]:
    """Each user's token as the config gives it: `token`, else the variable `token_env` names, if set."""
    tokens = {}
    for u in config.users:
        token = u.token or (os.environ.get(u.token_env) if u.token_env else None)
        if token:
            tokens[u.name] = token
    return tokens


def unset_token_env(config: ServerConfig) -> tuple[int, str] | None:
    """(index, variable) of the first user whose `token_env` names an unset variable, else None."""
    for i, u in enumerate(config.users):
        if not u.token and u.token_env and not os.environ.get(u.token_env):
            return i, u.token_env
    return None


def _apply_users(s: Session, config: ServerConfig, key: bytes) -> dict[str, str]:
    users = {u.name: u for u in s.scalars(select(UserRow))}
    given = configured_tokens(config)
    configured = {token_hash(key, token): name for name, token in given.items()}
    for holder in users.values():
        # A token the file now gives to someone else is taken away from its old holder.
        if holder.token_hash in configured and configured[holder.token_hash] != holder.name:
            holder.token_hash = token_hash(key, new_token())
    s.flush()
    generated: dict[str, str] = {}
    for u in config.users:
        row = users.get(u.name)
        wanted = _quota_json(u.quota_gpus)
        if row is None:
            token = given.get(u.name) or new_token()
            if u.name not in given:
                generated[u.name] = token
            row = UserRow(
                name=u.name, token_hash=token_hash(key, token), quota_gpus=u.quota_gpus, config_quota=wanted
            )
            s.add(row)
        elif row.config_quota != wanted:
            row.quota_gpus, row.config_quota = u.quota_gpus, wanted
        if u.name in given:
            row.token_hash = token_hash(key, given[u.name])
        row.group_name = u.group
        row.role = u.role
        row.acts_for = json.dumps(list(u.acts_for))
    return generated


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


def write_token_file(
    store: Store, config: ServerConfig, home: Path, generated: dict[str, str] | None = None
) -> Path | None:
    """Write the local user's token (0600) so the client on this machine picks it up.

    The store keeps only hashes, so the file is the one plain copy of a generated token: the config's
    token when it names one, else the one generated at this start, else the file's own when it still
    matches, else a new token replaces the user's old one (a lost file is re-issued, not recovered).
    Decided under the setup lock, so servers starting together on one database agree.
    """
    name = local_token_user(config)
    if name is None:
        return None
    path = home / "token"
    configured = configured_tokens(config)
    with store.write() as s:
        store.lock_setup(s)
        row = s.get(UserRow, name)
        if row is None:
            return None
        token = configured.get(name) or (generated or {}).get(name) or _file_token(path)
        if token is None or not same_hash(row.token_hash, token_hash(store.token_key, token)):
            token = new_token()
            row.token_hash = token_hash(store.token_key, token)
        write_private(path, token + "\n")
    return path


def _file_token(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except (FileNotFoundError, UnicodeDecodeError):
        return None


def write_private(path: Path, text: str) -> None:
    """Replace `path` atomically with a 0600 file holding `text`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
