"""Quota views: limits and high-priority usage per group and per member."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from hai_airflow.server.errors import not_found
from hai_airflow.server.intake.submission import high_usage
from hai_airflow.server.store.tables import GroupRow, UserRow
from hai_airflow.spec import QuotaUsageView, QuotaView


def quota_view(session: Session, group: str, user: str | None = None) -> QuotaView:
    g = session.get(GroupRow, group)
    if g is None:
        raise not_found("group", group, fix="See `hai quota` for the groups you belong to")
    per_user, per_group = high_usage(session)
    members = list(session.scalars(select(UserRow).where(UserRow.group_name == group).order_by(UserRow.name)))
    u = session.get(UserRow, user) if user is not None else None
    return QuotaView(
        group=group,
        group_quota_gpus=g.quota_gpus,
        group_used_gpus=per_group.get(group, 0),
        user=user,
        user_quota_gpus=u.quota_gpus if u is not None else None,
        user_used_gpus=per_user.get(user, 0) if user is not None else 0,
        users=tuple(
            QuotaUsageView(user=m.name, used_gpus=per_user.get(m.name, 0), quota_gpus=m.quota_gpus)
            for m in members
        ),
    )


def group_names(session: Session) -> list[str]:
    return list(session.scalars(select(GroupRow.name).order_by(GroupRow.name)))
