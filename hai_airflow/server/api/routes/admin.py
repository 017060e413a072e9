"""`GET /admin/check`: the ledger (`server.ledger`) run on the live store, for platform admins."""

from __future__ import annotations

from fastapi import APIRouter

from hai_airflow.server.api.routes.depends import CallerDep, CtxDep
from hai_airflow.server.control import ledger
from hai_airflow.server.errors import ApiError
from hai_airflow.spec import LedgerProblemView, LedgerView

router = APIRouter()


@router.get("/admin/check")
def check_store(ctx: CtxDep, caller: CallerDep) -> LedgerView:
    """Check the whole store's history: every job's state moves legal and in order, no job with two runs
    at once, no GPU held twice, no quota exceeded at any moment. Platform admins only."""
    if not caller.is_platform_admin:
        raise ApiError(403, "only a platform admin can check the store", fix="Ask the platform admin")
    with ctx.store.read() as s:
        jobs, nodes, quota = ledger.from_store(s)
    found = ledger.problems(jobs, nodes, quota)
    return LedgerView(
        jobs=len(jobs),
        instances=sum(len(j.runs) for j in jobs),
        events=sum(len(j.events) for j in jobs),
        problems=[LedgerProblemView(job_id=p.job_id, what=p.what) for p in found],
    )
