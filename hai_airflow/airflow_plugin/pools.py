"""Each hai resource group's high-priority GPU quota, mirrored as the Airflow pool `hai_<group>`."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hai_airflow.hooks.hai import DEFAULT_CONN_ID, HaiHook
from hai_airflow.spec import QuotaView

POOL_PREFIX = "hai_"
POOL_NOTE = "hai resource group {group}: high-priority GPU quota, mirrored by `hai airflow sync-pools`"
UNLIMITED = -1
"""Airflow's slot count for a pool without a limit (a group whose quota is unset)."""


def pool_name(group: str) -> str:
    """The Airflow pool of a resource group: ``hai_<group>``, other characters made ``_``."""
    return POOL_PREFIX + re.sub(r"[^A-Za-z0-9_.-]", "_", group)


class PoolChange(BaseModel):
    """One pool as the sync left it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pool: str = Field(description="Airflow pool name.")
    group: str | None = Field(description="The hai resource group it mirrors (None once deleted).")
    slots: int = Field(description="Pool slots = the group's high-priority GPU quota; -1 = unlimited.")
    action: Literal["created", "updated", "unchanged", "deleted"] = Field(description="What the sync did.")


def wanted_pools(quotas: Iterable[QuotaView]) -> dict[str, tuple[str, int]]:
    """pool name -> (group, slots): slots = the group's quota GPUs, unlimited when unset."""
    return {
        pool_name(q.group): (q.group, UNLIMITED if q.group_quota_gpus is None else q.group_quota_gpus)
        for q in quotas
    }


def is_mirrored(name: str, description: str | None) -> bool:
    """A pool this sync owns: our prefix and our note (pools a person made are left alone)."""
    return name.startswith(POOL_PREFIX) and "hai airflow sync-pools" in (description or "")


def apply_pools(quotas: Iterable[QuotaView], delete_stale: bool = True) -> list[PoolChange]:
    """Create or update one pool per group (include_deferred, so deferred hai tasks hold their GPUs).

    Pools this sync made for groups that no longer exist are deleted when `delete_stale`.
    Needs Airflow's metadata database: run it where the scheduler or the CLI runs.
    """
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session

    wanted = wanted_pools(quotas)
    changes: list[PoolChange] = []
    with create_session() as session:
        existing = {str(p.pool): p for p in Pool.get_pools(session=session)}
        for name, (group_name, slots) in sorted(wanted.items()):
            note = POOL_NOTE.format(group=group_name)
            old = existing.get(name)
            if old is not None and old.slots == slots and old.include_deferred and old.description == note:
                changes.append(PoolChange(pool=name, group=group_name, slots=slots, action="unchanged"))
                continue
            Pool.create_or_update_pool(name, slots, note, True, session=session)
            changes.append(
                PoolChange(
                    pool=name, group=group_name, slots=slots, action="created" if old is None else "updated"
                )
            )
        if delete_stale:
            for stale, pool in sorted(existing.items()):
                if stale not in wanted and is_mirrored(stale, pool.description):
                    session.delete(pool)
                    changes.append(
                        PoolChange(pool=stale, group=None, slots=pool.slots or 0, action="deleted")
                    )
    return changes


def sync_pools(hai_conn_id: str = DEFAULT_CONN_ID, delete_stale: bool = True) -> list[PoolChange]:
    """Read every group's quota the connection's user may see and mirror it as pools."""
    hook = HaiHook(hai_conn_id, timeout=10.0)
    try:
        quotas = hook.get_conn().quotas()
    finally:
        hook.close()
    return apply_pools(quotas, delete_stale=delete_stale)
