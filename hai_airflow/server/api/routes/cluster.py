"""Cluster routes: who am I, resource packages, nodes and their drains, the queue, and quotas."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from hai_airflow.server.api import queue_view
from hai_airflow.server.api.request_body import strict_body
from hai_airflow.server.api.routes.depends import CallerDep, CtxDep
from hai_airflow.server.errors import ApiError, not_found
from hai_airflow.server.intake import quotas, submission
from hai_airflow.server.jobs.auth import Caller
from hai_airflow.server.jobs.nodes import node_views, package_views
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.store import clock
from hai_airflow.server.store.tables import GroupRow, NodeRow, UserRow
from hai_airflow.spec import (
    DrainReason,
    NodeName,
    NodeView,
    PrincipalName,
    QueueEntryView,
    QuotaView,
    ResourcePackageView,
)

router = APIRouter()


class QuotaRequest(BaseModel):
    """Body of `PUT /quotas/users/{u}` and `/quotas/groups/{g}`; null = unlimited."""

    model_config = ConfigDict(extra="forbid")
    gpus: int | None = Field(ge=0, le=1_000_000, description="High-priority GPU quota; null = unlimited.")


@router.get("/whoami")
def whoami(caller: CallerDep) -> dict[str, Any]:
    """The effective user; `via` names the service acting for them (X-Hai-On-Behalf-Of), else null."""
    return {
        "user": caller.name,
        "group": caller.group,
        "role": caller.role,
        "admin_of": sorted(caller.admin_of),
        "via": caller.via,
    }


@router.get("/resource-packages")
def resource_packages(ctx: CtxDep, caller: CallerDep) -> list[ResourcePackageView]:
    with ctx.store.read() as s:
        return package_views(s, list(ctx.config.resource_packages))


@router.get("/nodes")
def nodes(ctx: CtxDep, caller: CallerDep) -> list[NodeView]:
    """Every node: its GPUs (held, reserved, free), its state, and the jobs on it (others' by id only)."""
    with ctx.store.read() as s:
        return node_views(s, caller.may_see)


class DrainRequest(BaseModel):
    """Body of `POST /nodes/{name}/drain`."""

    model_config = ConfigDict(extra="forbid")
    reason: DrainReason | None = Field(default=None, description="Why, as `hai nodes` shows it.")


@router.post("/nodes/{name}/drain")
def drain_node(
    name: NodeName,
    body: Annotated[DrainRequest, strict_body(DrainRequest)],
    ctx: CtxDep,
    caller: CallerDep,
) -> NodeView:
    """No new placement on the node (start or resume) until it is undrained; the jobs on it run to
    their end. Platform admins only; draining a drained node changes nothing."""
    with ctx.store.write() as s:
        row = _node_to_change(s, caller, name, "drain")
        if not row.drained:
            row.drained, row.drained_by, row.drained_at = True, caller.name, clock.now()
            row.drain_reason = body.reason
    ctx.wakeup.set()
    return _node_view(ctx, caller, name)


@router.post("/nodes/{name}/undrain")
def undrain_node(name: NodeName, ctx: CtxDep, caller: CallerDep) -> NodeView:
    """The node takes new jobs again. Platform admins only; undraining a ready node changes nothing."""
    with ctx.store.write() as s:
        row = _node_to_change(s, caller, name, "undrain")
        if row.drained:
            row.drained, row.drained_by, row.drained_at, row.drain_reason = False, None, None, None
    ctx.wakeup.set()
    return _node_view(ctx, caller, name)


def _node_to_change(s: Session, caller: Caller, name: str, action: str) -> NodeRow:
    if not caller.is_platform_admin:
        raise ApiError(403, f"only a platform admin can {action} nodes", fix="Ask the platform admin")
    row = s.get(NodeRow, name)
    if row is None:
        raise _no_such_node(name)
    return row


def _node_view(ctx: ServerContext, caller: Caller, name: str) -> NodeView:
    with ctx.store.read() as s:
        found = [v for v in node_views(s, caller.may_see) if v.name == name]
    if not found:  # the config file of a server starting just now dropped it
        raise _no_such_node(name)
    return found[0]


def _no_such_node(name: str) -> ApiError:
    return not_found("node", name, fix="See the nodes with `hai nodes`")


@router.get("/queue", response_model=list[QueueEntryView])
async def get_queue(ctx: CtxDep, caller: CallerDep) -> Response:
    """The waiting jobs in the order the controller's last plan serves them (`queue_view.queue_json`)."""
    return Response(await queue_view.queue_json(ctx, caller), media_type="application/json")


@router.get("/quota")
def get_quota(ctx: CtxDep, caller: CallerDep) -> QuotaView:
    with ctx.store.read() as s:
        return quotas.quota_view(s, caller.group, caller.name)


@router.get("/quotas")
def get_quotas(ctx: CtxDep, caller: CallerDep) -> list[QuotaView]:
    with ctx.store.read() as s:
        names = quotas.group_names(s)
        visible = [g for g in names if caller.administers(g) or g == caller.group]
        return [quotas.quota_view(s, g) for g in visible]


@router.get("/quota/check")
def check_quota(
    ctx: CtxDep, caller: CallerDep, gpus: Annotated[int, Query(ge=0, le=1_000_000)]
) -> dict[str, Any]:
    with ctx.store.read() as s:
        v = submission.quota_verdict(s, caller.name, caller.group, gpus)
    return {
        "allowed": v.allowed,
        "reason": v.reason,
        "user_used": v.user_used,
        "user_limit": v.user_limit,
        "group_used": v.group_used,
        "group_limit": v.group_limit,
    }


@router.put("/quotas/users/{user}")
def set_user_quota(
    user: PrincipalName,
    body: Annotated[QuotaRequest, strict_body(QuotaRequest)],
    ctx: CtxDep,
    caller: CallerDep,
) -> QuotaView:
    with ctx.store.write() as s:
        row = s.get(UserRow, user)
        if row is None and caller.is_platform_admin:
            raise not_found("user", user, fix="See the users with `hai quota --all`")
        # the same answer whether or not the user exists, so it tells nobody who is registered
        if row is None or not caller.may_set_quota_of(row.name, row.group_name):
            own = row is not None and row.name == caller.name
            raise ApiError(
                403,
                f"you may not set {user}'s quota"
                + (": a group admin sets the others' quotas, a platform admin hers" if own else ""),
                field="user",
                fix="Ask a platform admin" if own else "Ask an admin of that user's group",
            )
        row.quota_gpus = body.gpus
        group = row.group_name
    ctx.wakeup.set()
    with ctx.store.read() as s:
        return quotas.quota_view(s, group, user)


@router.put("/quotas/groups/{group}")
def set_group_quota(
    group: PrincipalName,
    body: Annotated[QuotaRequest, strict_body(QuotaRequest)],
    ctx: CtxDep,
    caller: CallerDep,
) -> QuotaView:
    if not caller.is_platform_admin:
        raise ApiError(
            403, "only a platform admin can set a group's quota", field="group", fix="Ask the platform admin"
        )
    with ctx.store.write() as s:
        row = s.get(GroupRow, group)
        if row is None:
            raise not_found("group", group, fix="See the groups with `hai quota --all`")
        row.quota_gpus = body.gpus
    ctx.wakeup.set()
    with ctx.store.read() as s:
        return quotas.quota_view(s, group)
